"""Sharded checkpoints of tiered tables on real gloo ranks: save on 2 ranks, resume on 2, 3 and 1.

A DLRM whose tables are ``key_value`` (SSD) and ``fused_uvm_caching`` (host memory) shards with
caches of a few dozen rows trains 3 steps; every rank flushes its caches and streams its stores
into the checkpoint; the run goes on. A save that fails (a full disk on one rank, a path that
cannot be a directory) raises on every rank and leaves the last checkpoint as it was. Fresh models
(their row files new and empty) then load the checkpoint and train the rest: bit-identical on the
same plan, within float tolerance on 3 ranks with another plan and on 1 rank. A process killed
while saving leaves the last checkpoint whole and no row files behind.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.multiprocess import run_ranks
from tests.reliability.checkpoint_files import run_python

STEPS, SAVE_AT, GLOBAL_BATCH, DIM = 6, 3, 24, 8
ROWS = {"t0": 3000, "t1": 5, "t2": 2000, "t3": 1500}


def _model(ssd: str, world_size: int) -> Any:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder, ShardingPlan
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )  # fmt: skip
    from lightrec.models import DLRM
    from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

    configs = [
        EmbeddingBagConfig(num_embeddings=ROWS["t0"], embedding_dim=DIM, name="t0", feature_names=["f0", "f1"]),
        EmbeddingBagConfig(num_embeddings=ROWS["t1"], embedding_dim=DIM, name="t1", feature_names=["f2"],
                           pooling=PoolingType.MEAN),
        EmbeddingBagConfig(num_embeddings=ROWS["t2"], embedding_dim=DIM, name="t2", feature_names=["f3"]),
        EmbeddingBagConfig(num_embeddings=ROWS["t3"], embedding_dim=DIM, name="t3", feature_names=["f4"]),
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(configs, device="meta")
    torch.manual_seed(0)
    dlrm = DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[8, 1])
    kv, uvm = "key_value", "fused_uvm_caching"
    gens = {
        2: {"t0": row_wise(compute_kernel=kv), "t1": data_parallel(), "t2": table_wise(rank=1, compute_kernel=kv),
            "t3": column_wise(ranks=[1, 0], compute_kernel=uvm)},
        3: {"t0": table_wise(rank=2, compute_kernel=kv), "t1": row_wise(), "t2": row_wise(compute_kernel=kv),
            "t3": column_wise(ranks=[2, 0], compute_kernel=kv)},
        1: {"t0": table_wise(rank=0, compute_kernel=kv), "t1": data_parallel(), "t2": table_wise(rank=0),
            "t3": column_wise(ranks=[0, 0], compute_kernel=uvm)},
    }[world_size]  # fmt: skip
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(ebc, gens, world_size=world_size)})
    fused_params = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1, "cache_load_factor": 0.01,
                    "cache_min_rows": 64, "ssd_storage_directory": ssd}  # fmt: skip
    return DistributedModelParallel(dlrm, device="cpu", plan=plan, sharders=[EmbeddingBagCollectionSharder(fused_params)])


def _build(ssd: str, world_size: int) -> tuple[Any, Any]:
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    model = _model(ssd, world_size)
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [("sparse", model.fused_optimizer), ("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.05)))]
    )
    return model, optimizer


def _step(model: Any, optimizer: Any, step: int, rank: int, world_size: int) -> float:
    import torch.distributed as dist

    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 + step)
    rows = [ROWS["t0"], ROWS["t0"], ROWS["t1"], ROWS["t2"], ROWS["t3"]]
    per_rank = GLOBAL_BATCH // world_size
    lengths = torch.randint(0, 3, (5, GLOBAL_BATCH), generator=g)
    x, y = torch.randn(GLOBAL_BATCH, 3, generator=g), torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
    lo = rank * per_rank
    mine = lengths[:, lo : lo + per_rank]
    values = []
    for k in range(5):
        ids = torch.randint(0, rows[k], (int(lengths[k].sum()),), generator=g)
        start = int(lengths[k, :lo].sum())
        values.append(ids[start : start + int(mine[k].sum())])
    kjt = KeyedJaggedTensor([f"f{k}" for k in range(5)], torch.cat(values), lengths=mine.reshape(-1), stride=per_rank)
    logits = model(x[lo : lo + per_rank], kjt).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[lo : lo + per_rank])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / world_size).item()


def _save_body(rank: int, world_size: int, path: str, ssd: str) -> dict[str, Any]:
    import lightrec.distributed.checkpoint.integrity as integrity
    from lightrec.distributed.checkpoint import CheckpointError, save_sharded_checkpoint

    model, optimizer = _build(ssd, world_size)
    losses, out = [], {}
    for step in range(STEPS):
        if step == SAVE_AT:
            ckpt = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": step}
            save_sharded_checkpoint(path, ckpt, model, [optimizer])
            before = sorted(os.listdir(path)), os.path.getmtime(os.path.join(path, "meta.pt"))
            real = integrity.shutil.disk_usage
            if rank == 1:  # a full disk on one rank
                integrity.shutil.disk_usage = lambda p, real=real: real(p)._replace(free=10)
            try:
                save_sharded_checkpoint(path, ckpt, model, [optimizer])
            except CheckpointError as e:
                out["full_disk"] = str(e)
            finally:
                integrity.shutil.disk_usage = real
            blocked = os.path.join(os.path.dirname(path), "a-file")
            if rank == 0:
                Path(blocked).write_text("not a directory")
            try:
                save_sharded_checkpoint(os.path.join(blocked, "step.ckpt"), ckpt, model, [optimizer])
            except CheckpointError as e:
                out["unwritable"] = str(e)
            out["unchanged"] = before == (sorted(os.listdir(path)), os.path.getmtime(os.path.join(path, "meta.pt")))
        losses.append(_step(model, optimizer, step, rank, world_size))
    out["losses"] = losses
    out["fetched"] = sum(m.kernel.stats().rows_fetched for m in model.modules() if getattr(m, "tiered", False))
    return out


def _resume_body(rank: int, world_size: int, path: str, ssd: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    model, optimizer = _build(ssd, world_size)
    ckpt = load_sharded_checkpoint(path, model, [optimizer])
    model.load_state_dict(ckpt["state_dict"])
    optimizer.load_state_dict(ckpt["optimizer_states"][0])
    assert ckpt["global_step"] == SAVE_AT
    return {"losses": [_step(model, optimizer, s, rank, world_size) for s in range(SAVE_AT, STEPS)]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tiered_ckpt")
    path = str(root / "step=3.ckpt")
    results = run_ranks(_save_body, 2, args=(path, str(root / "ssd")), timeout=300)
    return {"path": path, "ranks": results, "root": root}


def test_failed_saves_keep_the_last_checkpoint(saved: dict[str, Any]) -> None:
    for r in saved["ranks"]:
        assert "rank 1: " in r["full_disk"] and "not enough disk space" in r["full_disk"]
        assert "rank 0: " in r["unwritable"]
        assert r["unchanged"] and r["fetched"] > 100
    assert sorted(os.listdir(saved["path"])) == ["manifest.json", "meta.pt", "shards-rank00000.pt", "shards-rank00001.pt"]
    assert os.listdir(saved["root"] / "ssd") == []  # the row files are working stores, unlinked: never a checkpoint


def test_resume_on_the_same_plan_is_bit_identical(saved: dict[str, Any], tmp_path: Path) -> None:
    resumed = run_ranks(_resume_body, 2, args=(saved["path"], str(tmp_path)), timeout=300)
    assert resumed[0]["losses"] == saved["ranks"][0]["losses"][SAVE_AT:]


@pytest.mark.parametrize("world_size", [3, 1], ids=["2->3", "2->1"])
def test_resharded_resume(saved: dict[str, Any], world_size: int, tmp_path: Path) -> None:
    resumed = run_ranks(_resume_body, world_size, args=(saved["path"], str(tmp_path)), timeout=300)
    assert resumed[0]["losses"] == pytest.approx(saved["ranks"][0]["losses"][SAVE_AT:], rel=1e-5, abs=1e-6)


CHILD = """
import os, signal, sys, torch, torch.distributed as dist
from lightrec.distributed.checkpoint import integrity, save_sharded_checkpoint
from tests.distributed.test_tiered_checkpoint import _build, _step
path, ssd = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + ssd + "/../rendezvous", rank=0, world_size=1)
model, optimizer = _build(ssd, 1)
for step in range(2):
    _step(model, optimizer, step, 0, 1)
    if step == 0:
        save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "step": 1}, model)
write = integrity.HashingWriter.write
def write_then_die(self, data):
    write(self, data)
    if self.bytes > 4096:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
integrity.HashingWriter.write = write_then_die
save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "step": 2}, model)
print("not killed")
"""


def test_killed_save_leaves_the_last_checkpoint_and_no_row_files(tmp_path: Path) -> None:
    from lightrec.distributed.checkpoint import open_checkpoint

    ssd, path = tmp_path / "ssd", tmp_path / "last.ckpt"
    ssd.mkdir()
    code = CHILD.replace("sys.argv[1], sys.argv[2]", f"{str(path)!r}, {str(ssd)!r}")
    done = run_python(code)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr[-3000:])
    assert open_checkpoint(path).meta["step"] == 1
    assert os.listdir(ssd) == []
