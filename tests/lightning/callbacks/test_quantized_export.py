"""QuantizedExport: a single-process fit and a 2-rank RecStrategy fit write loadable quantized artifacts.

The 2-rank run shards the toy DLRM's tables (row-wise, data-parallel and table-wise), so the
callback's export is a collective gather; its artifact is compared exactly with the quantized
unsharded model rebuilt from the trained tables in one process, and (slow) within float tolerance
with the artifact of the same training on one rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.multiprocess import free_port, run_nccl, run_ranks

STEPS = 4


def _trainer(tmp: str, callback, devices: int = 1, strategy=None, max_epochs: int = 1, max_steps: int = -1,  # noqa: ANN001, ANN202
             accelerator: str = "cpu"):
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator=accelerator, devices=devices, strategy=strategy or "auto", max_epochs=max_epochs, max_steps=max_steps,
        num_sanity_val_steps=0, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback], default_root_dir=tmp,
    )  # fmt: skip


def _inputs(batch) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    kjt = batch.sparse_features
    return batch.dense_features, kjt.values(), kjt.lengths()


def test_single_process_fit_exports_every_epoch_and_at_the_end(tmp_path: Path) -> None:
    from lightrec.inference import load, quantize
    from lightrec.lightning.callbacks.quantized_export import QuantizedExport
    from tests.lightning.toy import ToyDLRM, toy_data

    data = toy_data(batch_size=32, num_train_batches=3)
    callback = QuantizedExport(dtype="int8", every_n_epochs=1, filename="toy_{dtype}_epoch{epoch}")
    module = ToyDLRM(dense_optimizer="sgd", dense_lr=0.1)
    _trainer(str(tmp_path), callback, max_epochs=2).fit(module, datamodule=data)
    export_dir = tmp_path / "export"  # no logger: <default_root_dir>/export
    # one artifact per epoch; the fit-end export is skipped (same step as the last epoch's)
    assert callback.paths == [export_dir / "toy_int8_epoch0.pt", export_dir / "toy_int8_epoch1.pt"]
    assert sorted(p.name for p in export_dir.iterdir()) == [
        "toy_int8_epoch0.pt", "toy_int8_epoch0.pt.meta.json", "toy_int8_epoch1.pt", "toy_int8_epoch1.pt.meta.json"]
    meta = json.loads((export_dir / "toy_int8_epoch1.pt.meta.json").read_text())
    assert (meta["epoch"], meta["global_step"], meta["dtype"]) == (1, 6, ["INT8"])
    batch = data.datasets["test"][0]
    want = quantize(module.model, "int8")(batch.dense_features, batch.sparse_features)
    assert torch.equal(load(callback.paths[-1])(*_inputs(batch)), want)
    # the epoch-0 artifact holds the weights of that time: training moved them since
    assert not torch.equal(load(callback.paths[0])(*_inputs(batch)), want)


def test_fit_end_export_and_argument_errors(tmp_path: Path) -> None:
    from lightrec.inference import load, quantize
    from lightrec.lightning.callbacks.quantized_export import QuantizedExport
    from tests.lightning.toy import ToyDLRM, toy_data

    data = toy_data(batch_size=32, num_train_batches=2)
    callback = QuantizedExport(dirpath=tmp_path / "serving", dtype="int4", format="export")
    module = ToyDLRM(dense_optimizer="sgd", dense_lr=0.1)
    _trainer(str(tmp_path), callback).fit(module, datamodule=data)
    assert callback.paths == [tmp_path / "serving" / "model_int4.pt2"]
    batch = data.datasets["test"][0]
    got = load(callback.paths[0])(*_inputs(batch))
    assert torch.equal(got, quantize(module.model, "int4")(batch.dense_features, batch.sparse_features))
    with pytest.raises(ValueError, match="every_n_epochs must be None"):
        QuantizedExport(every_n_epochs=0)
    with pytest.raises(ValueError, match="format must be one of"):
        QuantizedExport(format="onnx")
    with pytest.raises(ValueError, match="int3"):
        QuantizedExport(dtype="int3")
    with pytest.raises(ValueError, match="may only use the fields"):
        QuantizedExport(filename="model_{rank}")


@pytest.mark.parametrize("filename", ["model_{epoch.x}", "model_{epoch[0]}"])
def test_filename_with_attribute_or_index_fields_is_refused(filename: str) -> None:
    from lightrec.lightning.callbacks.quantized_export import QuantizedExport

    with pytest.raises(ValueError, match="may only use the fields"):  # not a raw AttributeError / TypeError
        QuantizedExport(filename=filename)


@pytest.mark.parametrize("filename,format,name", [
    ("model_v1.5", "torchscript", "model_v1.5.pt"),  # ".5" is no artifact suffix
    ("model_{epoch}.e{step}", "export", "model_2.e7.pt2"),
    ("model.pt", "torchscript", "model.pt"),
    ("model.pt2", "export", "model.pt2"),
])
def test_artifact_suffix_is_added_unless_the_name_has_one(tmp_path: Path, filename: str, format: str, name: str) -> None:
    from types import SimpleNamespace

    from lightrec.lightning.callbacks.quantized_export import QuantizedExport

    trainer = SimpleNamespace(current_epoch=2, global_step=7)
    callback = QuantizedExport(dirpath=tmp_path, filename=filename, format=format)
    assert callback.artifact_path(trainer) == tmp_path / name  # type: ignore[arg-type]


def test_failed_export_restores_the_models_train_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import lightrec.lightning.callbacks.quantized_export as quantized_export
    from tests.lightning.toy import ToyDLRM

    module = ToyDLRM(dense_optimizer="sgd", dense_lr=0.1)
    module.model.train()

    def fails(*args: object, **kwargs: object) -> None:
        module.model.eval()  # what an export does to the model it scripts, before it fails
        raise OSError("No space left on device")

    monkeypatch.setattr(quantized_export, "export_on_rank", fails)
    trainer = SimpleNamespace(current_epoch=0, global_step=1, is_global_zero=True, default_root_dir=str(tmp_path))
    with pytest.raises(OSError, match="No space left"):
        quantized_export.QuantizedExport(dirpath=tmp_path).export_now(trainer, module)  # type: ignore[arg-type]
    assert module.model.training  # training goes on in train mode (dropout, batch norm)


def _fit_and_export(rank: int, world_size: int, port: int, tmp: str, accelerator: str = "cpu") -> dict:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), NODE_RANK="0",
    )  # fmt: skip
    from lightrec.inference import has_sharded_collections, unshard
    from lightrec.lightning import RecStrategy
    from lightrec.lightning.callbacks.quantized_export import QuantizedExport
    from tests.lightning.toy import ToyDLRM, mixed_toy_plan, toy_data

    plan = mixed_toy_plan(world_size, device_type="cuda" if accelerator == "gpu" else "cpu")
    strategy = RecStrategy(plan=plan, fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1})
    callback = QuantizedExport(dirpath=Path(tmp) / f"world{world_size}", dtype="int8")
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    data = toy_data(batch_size=64 // world_size, num_train_batches=STEPS * world_size, block_size=32)
    trainer = _trainer(tmp, callback, devices=world_size, strategy=strategy, max_steps=STEPS, accelerator=accelerator)
    trainer.fit(module, datamodule=data)
    assert has_sharded_collections(module.model)  # the export above went through the gather
    trained = unshard(module.model, dst=0)  # the trained float tables, for the exact reference
    return {"paths": [str(p) for p in callback.paths],
            "state": {k: v.cpu().clone() for k, v in trained.state_dict().items()} if trained is not None else None}


def _scores(path: str, batch) -> torch.Tensor:  # noqa: ANN001
    from lightrec.inference import load

    return load(path)(*_inputs(batch))


def _two_rank_run(tmp_path: Path) -> tuple[Path, dict]:
    two = run_ranks(_fit_and_export, 2, args=(free_port(), str(tmp_path)), timeout=240)
    artifact = tmp_path / "world2" / "model_int8.pt"
    assert two[0]["paths"] == two[1]["paths"] == [str(artifact)]  # every rank learns the path rank 0 wrote
    assert two[1]["state"] is None
    return artifact, two[0]["state"]


def _quantized_reference(state: dict, batch) -> torch.Tensor:  # noqa: ANN001
    from lightrec.inference import quantize
    from tests.lightning.toy import ToyDLRM

    reference = ToyDLRM().model
    reference.load_state_dict(state)
    return quantize(reference, "int8")(batch.dense_features, batch.sparse_features)


def test_two_rank_rec_strategy_export_equals_one_process_quantization(tmp_path: Path) -> None:
    """Rank 0's artifact is exactly quantize() of the trained tables, run in one process."""
    from tests.lightning.toy import toy_data

    artifact, state = _two_rank_run(tmp_path)
    batch = toy_data().datasets["test"][0]
    assert torch.equal(_scores(str(artifact), batch), _quantized_reference(state, batch))
    assert not [p for p in artifact.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
def test_two_rank_export_is_close_to_one_rank_training(tmp_path: Path) -> None:
    """The same training on one rank exports an artifact equal up to float reordering (and the
    rare quantization step it flips), far closer than the untrained model."""
    from lightrec.inference import quantize
    from tests.lightning.toy import ToyDLRM, toy_data

    artifact, state = _two_rank_run(tmp_path)
    one = run_ranks(_fit_and_export, 1, args=(free_port(), str(tmp_path)), timeout=240)[0]
    batch = toy_data().datasets["test"][0]
    two_scores, single = _scores(str(artifact), batch), _scores(one["paths"][0], batch)
    torch.testing.assert_close(single, two_scores, atol=5e-3, rtol=0)
    untrained = quantize(ToyDLRM().model, "int8")(batch.dense_features, batch.sparse_features)
    assert (untrained - two_scores).abs().max() > 20 * (single - two_scores).abs().max()


@pytest.mark.gpu
def test_gpu_rec_strategy_export_equals_one_process_quantization(tmp_path: Path) -> None:
    """Trained on CUDA (RecStrategy, NCCL group of size 1), the int8 artifact written at fit end is
    exactly quantize() of the trained tables, run on CPU in one process."""
    from tests.lightning.toy import toy_data

    one = run_nccl(_fit_and_export, args=(free_port(), str(tmp_path), "gpu"), timeout=300)
    artifact = tmp_path / "world1" / "model_int8.pt"
    assert one["paths"] == [str(artifact)]
    batch = toy_data().datasets["test"][0]
    assert torch.equal(_scores(str(artifact), batch), _quantized_reference(one["state"], batch))
