"""RecStrategy forwards DDPStrategy's dense-part options, or rejects them, on real gloo ranks.

* ``ddp_comm_hook`` (+ ``ddp_comm_state``, ``ddp_comm_wrapper``) is registered on the DDP wrapper
  of the dense part: a hook that hands back zero gradients freezes the dense layers while the
  sharded tables still train; without it both change.
* A ``LayerSync`` plugin (what ``sync_batchnorm=True`` installs) is applied to the dense part when
  fitting: a CPU plugin that all-reduces batch statistics leaves identical BatchNorm running
  statistics on ranks that saw different data; torch's ``SyncBatchNorm`` (``sync_batchnorm=True``)
  cannot run on CPU and is refused at setup with an error naming the option.
* Post-local SGD (``model_averaging_period``, ``PostLocalSGDState``) is refused at construction.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS = 3


class _AllReduceStatsBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d on CPU whose running statistics are the *global* batch's (all-reduced over ranks).

    The output is normalised by the local batch (as a plain BatchNorm1d in training); only the
    running mean/variance are synchronised -- enough to tell whether the layer was converted.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.distributed.is_initialized():
            with torch.no_grad():
                moments = torch.stack([x.sum(0), (x * x).sum(0)])
                count = torch.tensor([float(x.shape[0])])
                torch.distributed.all_reduce(moments)
                torch.distributed.all_reduce(count)
                mean = moments[0] / count
                var = moments[1] / count - mean * mean
                n = float(count)
                self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
                self.running_var.mul_(1 - self.momentum).add_(var * n / max(n - 1, 1), alpha=self.momentum)
                self.num_batches_tracked.add_(1)
            return nn.functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return super().forward(x)


def _layer_sync() -> Any:
    from lightning.pytorch.plugins import LayerSync

    class AllReduceStats(LayerSync):
        def apply(self, model: nn.Module) -> nn.Module:
            for name, child in list(model.named_children()):
                if type(child) is nn.BatchNorm1d:
                    synced = _AllReduceStatsBatchNorm(child.num_features)
                    synced.load_state_dict(child.state_dict())
                    setattr(model, name, synced)
                else:
                    self.apply(child)
            return model

        def revert(self, model: nn.Module) -> nn.Module:
            return model

    return AllReduceStats()


def _module() -> Any:
    from tests.lightning.toy import ToyDLRM

    class NormedDLRM(ToyDLRM):
        """The toy DLRM with a BatchNorm1d on its dense input."""

        def __init__(self) -> None:
            super().__init__(device="meta", dense_optimizer="sgd", dense_lr=0.1)
            self.norm = nn.BatchNorm1d(13)

        def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
            return self.model(self.norm(dense), sparse)

    return NormedDLRM()


def _local_tables(module: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's part of every embedding table (zeros where other ranks hold the rows)."""
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    return {
        k: v.full_tensor_local() if isinstance(v, ShardedTableState) else v.detach().clone()
        for k, v in module.state_dict().items()
        if "embedding_bags" in k
    }


def _fit(world_size: int, tmp: str, refused: bool = False, **options: Any) -> dict[str, Any]:
    import lightning.pytorch as pl

    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import toy_data

    at_start: dict[str, dict[str, torch.Tensor]] = {}

    class Record(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            at_start["tables"] = _local_tables(module)
            at_start["dense"] = {n: p.detach().clone() for n, p in module.model.dense_arch.named_parameters()}

    trainer_options = {k: options.pop(k) for k in ("sync_batchnorm", "plugins") if k in options}
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=STEPS, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(fused_params={"optimizer": "sgd", "learning_rate": 0.1}, **options),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp, callbacks=[Record()], **trainer_options,
    )  # fmt: skip
    module = _module()
    data = toy_data(batch_size=16, num_train_batches=STEPS * world_size, block_size=16)
    if refused:
        with pytest.raises(ValueError) as refusal:
            trainer.fit(module, datamodule=data)
        return {"error": str(refusal.value)}
    trainer.fit(module, datamodule=data)
    tables = _local_tables(module)
    return {
        "dense_moved": any(
            not torch.equal(p.detach(), at_start["dense"][n])
            for n, p in module.model.dense_arch.named_parameters()
        ),
        "tables_moved": any(not torch.equal(v, at_start["tables"][k]) for k, v in tables.items()),
        "norm_type": type(module.norm).__name__,
        "running_mean": module.norm.running_mean.clone(),
    }


def _body(rank: int, world_size: int, port: int, tmp: str) -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    calls = {"hook": 0, "wrapped": 0}

    # DDP checks a hook's annotations against the real GradBucket / Future classes, which this
    # module's postponed (string) annotations are not: the hooks leave them out.
    def zero_gradients(state, bucket):  # noqa: ANN001, ANN202
        state["hook"] += 1
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(torch.zeros_like(bucket.buffer()))
        return future

    def counting(hook: Any) -> Any:
        def wrapped(state, bucket):  # noqa: ANN001, ANN202
            state["wrapped"] += 1
            return hook(state, bucket)

        return wrapped

    torch.manual_seed(rank)
    out = {
        "plain": _fit(world_size, tmp),
        "hooked": _fit(
            world_size, tmp, ddp_comm_hook=zero_gradients, ddp_comm_state=calls, ddp_comm_wrapper=counting
        ),
        "layer_sync": _fit(world_size, tmp, plugins=[_layer_sync()]),
        "sync_batchnorm": _fit(world_size, tmp, refused=True, sync_batchnorm=True),
    }
    out["calls"] = calls
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(_body, 2, args=(free_port(), str(tmp_path_factory.mktemp("ddp_options"))), timeout=300)


def test_comm_hook_and_wrapper_reach_the_dense_ddp(results: list[dict[str, Any]]) -> None:
    for r in results:
        plain, hooked = r["plain"], r["hooked"]
        assert plain["dense_moved"] and plain["tables_moved"]
        assert not hooked["dense_moved"], "the zero-gradient hook must freeze the dense layers"
        assert hooked["tables_moved"], "the sharded tables are not behind DDP: they still train"
        assert r["calls"]["hook"] >= STEPS and r["calls"]["wrapped"] == r["calls"]["hook"]


def test_layer_sync_plugin_converts_the_dense_part(results: list[dict[str, Any]]) -> None:
    plain = [r["plain"] for r in results]
    synced = [r["layer_sync"] for r in results]
    assert all(s["norm_type"] == "_AllReduceStatsBatchNorm" for s in synced)
    assert all(p["norm_type"] == "BatchNorm1d" for p in plain)
    # ranks see different samples: plain running statistics differ, synced ones are the global batch's
    assert not torch.allclose(plain[0]["running_mean"], plain[1]["running_mean"])
    torch.testing.assert_close(synced[0]["running_mean"], synced[1]["running_mean"])


def test_sync_batchnorm_on_cpu_is_refused_at_setup(results: list[dict[str, Any]]) -> None:
    for r in results:
        message = r["sync_batchnorm"]["error"]
        assert "sync_batchnorm=True" in message and "CPU" in message and "norm" in message


def test_post_local_sgd_is_refused() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState

    from lightrec.lightning import RecStrategy

    with pytest.raises(ValueError, match="model_averaging_period=4"):
        RecStrategy(model_averaging_period=4)
    with pytest.raises(ValueError, match="PostLocalSGDState"):
        RecStrategy(
            ddp_comm_state=PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2)
        )
