"""Deliver 1: no code runs from any file lightrec reads (``weights_only=True`` on every load).

Each read path gets a checkpoint whose unpickling would create a marker file (``builtins.open``
named in the pickle). The manifest is re-signed after the file is rewritten, as an attacker who
controls the folder would do, so it is ``weights_only`` -- not the checksum -- that refuses it. The
first test shows the payload is live: ``torch.load(weights_only=False)`` does create the marker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.reliability.checkpoint_files import TOY_SAVE, poison, resign, run_python


@pytest.fixture(scope="module")
def toy_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecStrategy folder, its consolidated file and a plain Lightning checkpoint of the toy DLRM."""
    out = tmp_path_factory.mktemp("toy")
    done = run_python(TOY_SAVE.format(out=str(out)))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture
def copies(toy_checkpoints: Path, tmp_path: Path) -> Path:
    for name in ("sharded.ckpt", "full.ckpt", "lightning.ckpt"):
        src = toy_checkpoints / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    return tmp_path


def _poisoned_folder(copies: Path, which: str) -> tuple[Path, Path]:
    folder, marker = copies / "sharded.ckpt", copies / "marker"
    poison(folder / which, marker)
    resign(folder, which)
    return folder, marker


def test_the_payload_runs_code_when_loaded_without_weights_only(copies: Path) -> None:
    folder, marker = _poisoned_folder(copies, "meta.pt")
    torch.load(folder / "meta.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("which", ["meta.pt", "shards-rank00000.pt"])
def test_sharded_folder_files_are_refused(copies: Path, which: str) -> None:
    from lightrec.distributed.checkpoint import UnsafeCheckpointError, open_checkpoint

    folder, marker = _poisoned_folder(copies, which)
    with pytest.raises(UnsafeCheckpointError, match=rf"{which}.*not safe to unpickle \(it names io\.open\)"):
        open_checkpoint(folder)
    assert not marker.exists()


def test_consolidated_file_is_refused(copies: Path) -> None:
    from lightrec.distributed.checkpoint import UnsafeCheckpointError, open_checkpoint

    poison(copies / "full.ckpt", copies / "marker")
    with pytest.raises(UnsafeCheckpointError, match="full.ckpt"):
        open_checkpoint(copies / "full.ckpt")
    assert not (copies / "marker").exists()


@pytest.mark.parametrize("source", ["full.ckpt", "sharded.ckpt"])
def test_export_from_checkpoint_refuses(copies: Path, source: str) -> None:
    from lightrec.distributed.checkpoint import UnsafeCheckpointError
    from lightrec.inference import export_from_checkpoint
    from tests.lightning.toy import ToyDLRM

    if source == "full.ckpt":
        poison(copies / source, copies / "marker")
    else:
        _poisoned_folder(copies, "meta.pt")
    with pytest.raises(UnsafeCheckpointError):
        export_from_checkpoint(copies / source, lambda: ToyDLRM(device="meta").model, copies / "out.pt")
    assert not (copies / "marker").exists()


def test_cli_export_and_consolidate_refuse(copies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightrec.cli import main

    poison(copies / "full.ckpt", copies / "marker")
    _poisoned_folder(copies, "shards-rank00000.pt")
    for argv in (
        ["export", str(copies / "full.ckpt")],
        ["export", str(copies / "sharded.ckpt")],
        ["consolidate", str(copies / "sharded.ckpt"), str(copies / "again.ckpt")],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code != 0 and "not safe to unpickle" in err, (argv, code, err)
    assert not (copies / "marker").exists()
    assert not (copies / "again.ckpt").exists()


def test_rec_strategy_load_checkpoint_honours_weights_only(copies: Path) -> None:
    from lightrec.distributed.checkpoint import UnsafeCheckpointError
    from lightrec.lightning import RecStrategy

    poison(copies / "lightning.ckpt", copies / "marker")
    strategy = RecStrategy()
    for weights_only in (None, True):
        with pytest.raises(UnsafeCheckpointError, match="lightning.ckpt"):
            strategy.load_checkpoint(copies / "lightning.ckpt", weights_only=weights_only)
    assert not (copies / "marker").exists()
    _poisoned_folder(copies, "meta.pt")
    with pytest.raises(UnsafeCheckpointError, match="meta.pt"):  # refused before the model is needed
        strategy.load_checkpoint(copies / "sharded.ckpt", weights_only=False)  # lightrec files: always safe
    assert not (copies / "marker").exists()
    strategy.load_checkpoint(copies / "lightning.ckpt", weights_only=False)  # the caller's explicit choice
    assert (copies / "marker").exists()


def test_load_from_checkpoint_refuses(copies: Path) -> None:
    from tests.lightning.toy import ToyDLRM

    poison(copies / "lightning.ckpt", copies / "marker")
    with pytest.raises(Exception, match="Weights only load failed|not safe"):
        ToyDLRM.load_from_checkpoint(copies / "lightning.ckpt")
    assert not (copies / "marker").exists()
    ToyDLRM.load_from_checkpoint(
        copies / "lightning.ckpt", weights_only=False
    )  # control: the payload is live
    assert (copies / "marker").exists()


def test_fit_with_a_poisoned_ckpt_path_refuses(copies: Path) -> None:
    folder, marker = _poisoned_folder(copies, "meta.pt")
    code = f"""
import lightning.pytorch as pl
from lightrec.lightning import RecStrategy
from tests.lightning.toy import ToyDLRM, toy_data
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=3, strategy=RecStrategy(), logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(ToyDLRM(device="meta", dense_optimizer="sgd"), datamodule=toy_data(), ckpt_path={str(folder)!r})
"""
    done = run_python(code)
    assert done.returncode != 0
    assert "UnsafeCheckpointError" in done.stderr and "meta.pt" in done.stderr, done.stderr[-3000:]
    assert not marker.exists()


def test_files_written_under_the_former_module_paths_still_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before issue 32's layout, ``ShardedTableState`` lived in ``lightrec.distributed.state_dict``
    and the plan types in the one module ``lightrec.distributed.planner.plan``; files pickled then
    name them so, and still load with ``weights_only=True`` (through ``load_file`` and a plain
    ``torch.load``)."""
    import sys
    import types
    import zipfile

    from lightrec.distributed.checkpoint import load_file
    from lightrec.distributed.planner import plan
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    ShardMetadata, ShardingPlan, ShardingType = plan.ShardMetadata, plan.ShardingPlan, plan.ShardingType
    kernel = plan.EmbeddingComputeKernel.FUSED

    meta = ShardMetadata([2, 0], [2, 4], "rank:1/cpu")
    state = ShardedTableState([4, 4], [(meta, torch.arange(8.0).view(2, 4))], torch.float32, [meta])
    sharding = plan.ParameterSharding("data_parallel", "dense", [0, 1])
    payload = {"t.weight": state, "sharding": sharding, "plan": ShardingPlan(),
               "kinds": [ShardingType.ROW_WISE, kernel]}  # fmt: skip

    path = tmp_path / "old.pt"
    with monkeypatch.context() as m:  # pickle as the old code did: the classes under their former modules
        old_module = types.ModuleType("lightrec.distributed.state_dict")
        old_module.ShardedTableState = ShardedTableState  # type: ignore[attr-defined]
        m.setitem(sys.modules, "lightrec.distributed.state_dict", old_module)
        m.setattr(ShardedTableState, "__module__", "lightrec.distributed.state_dict")
        for name in ("ShardMetadata", "ParameterSharding", "ShardingPlan", "EmbeddingModuleShardingPlan", "ShardingType",
                     "EmbeddingComputeKernel"):  # fmt: skip
            m.setattr(getattr(plan, name), "__module__", "lightrec.distributed.planner.plan")
        torch.save(payload, path)
    with zipfile.ZipFile(path) as z:
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"lightrec.distributed.state_dict\nShardedTableState" in pickled
    assert b"lightrec.distributed.planner.plan\nShardMetadata" in pickled
    assert b"lightrec.distributed.planner.plan\nShardingType" in pickled
    assert b"lightrec.distributed.planner.plan\nParameterSharding" in pickled

    for loaded in (load_file(path), torch.load(path, weights_only=True)):
        got = loaded["t.weight"]
        assert type(got) is ShardedTableState and got.global_shape == [4, 4] and got.all_shards == [meta]
        assert got.shards[0][0] == meta and torch.equal(got.shards[0][1], torch.arange(8.0).view(2, 4))
        assert loaded["sharding"] == sharding and loaded["plan"] == ShardingPlan()
        assert loaded["kinds"] == [ShardingType.ROW_WISE, kernel]
        assert loaded["kinds"][0] is ShardingType.ROW_WISE


def test_a_full_sharding_plan_loads_with_weights_only_after_importing_lightrec(tmp_path: Path) -> None:
    """A plan with shard specs, cache and key-value parameters round-trips through ``torch.save`` and
    ``torch.load(weights_only=True)`` in a fresh process that only imported ``lightrec.distributed``
    (its list/dict subclasses pickle as calls the safe unpickler allows)."""
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.distributed import ShardingPlan, construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.planner import plan

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=t, num_embeddings=10, embedding_dim=4, feature_names=[f"f_{t}"])
                                  for t in ("t", "u")], device="meta")  # fmt: skip
    full = ShardingPlan({"sparse.ebc": construct_module_sharding_plan(
        ebc, {"t": row_wise(), "u": table_wise(rank=0, compute_kernel="fused_uvm_caching")}, world_size=2)})  # fmt: skip
    full.plan["sparse.ebc"]["u"].cache_params = plan.CacheParams(algorithm=plan.CacheAlgorithm.LFU, load_factor=0.2)
    full.plan["sparse.ebc"]["t"].key_value_params = plan.KeyValueParams(ssd_storage_directory="/ssd")
    path = tmp_path / "plan.pt"
    torch.save({"plan": full}, path)
    code = f"""
import torch, lightrec.distributed
from lightrec.distributed.planner import plan
loaded = torch.load({str(path)!r}, weights_only=True)["plan"]
module = loaded.plan["sparse.ebc"]
assert type(module) is plan.EmbeddingModuleShardingPlan and type(module["t"].sharding_spec) is plan.EnumerableShardingSpec
assert [s.placement for s in module["t"].sharding_spec] == ["rank:0/cpu", "rank:1/cpu"]
assert module["u"].cache_params.algorithm is plan.CacheAlgorithm.LFU
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    reloaded = torch.load(path, weights_only=True)["plan"]
    assert reloaded == full
