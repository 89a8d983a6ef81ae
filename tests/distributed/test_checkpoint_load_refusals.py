"""Sharded checkpoints loaded where they do not fit, or into a model of another layout.

* managed-collision tables saved with other buckets (6 here, loaded into 3) are refused before
  anything changes -- by ``load_sharded_checkpoint`` and by a plain ``load_state_dict`` -- where
  the embedding weights in front of the id map used to be copied before the map failed;
* a sharded checkpoint folder loads into the *unsharded* model (its blocks are assembled into whole
  tables, managed-collision id maps included), where ``load_state_dict`` used to fail half-way on
  the missing tables; optimizer state it cannot take (fused table state into ``torch.optim``) is
  refused up front;
* a dense optimizer of another type is refused even when the live one has no state yet (torch
  creates it at the first step), while a fresh optimizer of the saved type -- the usual resume --
  loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.test_dmp import _dlrm
from tests.distributed.test_sharded_checkpoint import _build, _plan, _step
from tests.multiprocess import run_ranks

MC_ROWS, MC_BUCKETS = 30, 6


# ---- helpers ------------------------------------------------------------------------------------
def _full(value: Any) -> torch.Tensor:
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    return (value.full_tensor_local() if isinstance(value, ShardedTableState) else value).detach().clone()


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: _full(v) for k, v in model.state_dict().items()}


def _changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> list[str]:
    after = _snapshot(model)
    return sorted(k for k in before if not torch.equal(before[k], after[k]))


def _mc_model(buckets: int, device: str) -> Any:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.modules.managed_collision import (
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        ManagedCollisionEmbeddingBagCollection,
        MCHManagedCollisionModule,
    )

    torch.manual_seed(1)
    configs = [EmbeddingBagConfig(num_embeddings=MC_ROWS, embedding_dim=4, name="t0", feature_names=["f0"])]
    modules: dict[str, Any] = {"t0": MCHManagedCollisionModule(MC_ROWS, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=10**6,
                                               buckets=buckets)}  # fmt: skip
    model = torch.nn.Module()
    model.mc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(configs, device=device), ManagedCollisionCollection(modules, configs)
    )
    return model


def _kjt(ids: torch.Tensor) -> Any:
    from lightrec import KeyedJaggedTensor

    return KeyedJaggedTensor(["f0"], ids, lengths=torch.ones(ids.numel(), dtype=torch.int64))


def _mc_save_body(rank: int, world: int, path: str) -> dict[str, torch.Tensor]:
    from lightrec.distributed import DistributedModelParallel, gather_full_state_dict
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    dmp = DistributedModelParallel(_mc_model(MC_BUCKETS, "meta"))
    g = torch.Generator().manual_seed(0)
    for s in range(6):
        ids = torch.randint(0, 10**6, (world, 4), generator=g)[rank] // 1000 * 1000 + s % 3
        pooled, _ = dmp.module.mc(_kjt(ids))
        pooled.wait().values().sum().backward()
    save_sharded_checkpoint(path, {"state_dict": dmp.state_dict()}, dmp)
    return gather_full_state_dict(dmp.state_dict())


def _mc_other_buckets_body(rank: int, world: int, path: str) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint

    dmp = DistributedModelParallel(_mc_model(3, "meta"))
    pooled, _ = dmp.module.mc(_kjt(torch.tensor([5, 500_000])))  # some state of its own
    pooled.wait()
    before = _snapshot(dmp)
    out: dict[str, Any] = {}
    try:
        dmp.load_state_dict(load_sharded_checkpoint(path, dmp)["state_dict"])
        out["loaded"] = True
    except CheckpointError as e:
        out["error"] = str(e)
    except Exception as e:  # noqa: BLE001 -- an untyped error (after a half load) is what the test rejects
        out["untyped"] = f"{type(e).__name__}: {e}"
    out["changed"] = _changed(before, dmp)
    return out


@pytest.fixture(scope="module")
def mc_saved(tmp_path_factory: Any) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("mc") / "ckpt")
    full = run_ranks(_mc_save_body, world_size=2, args=(path,), timeout=300)[0]
    return {"path": path, "full": full}


# ---- 1. managed-collision tables of other buckets -----------------------------------------------
def test_mc_checkpoint_of_other_buckets_is_refused_before_anything_changes(mc_saved: dict[str, Any]) -> None:
    result = run_ranks(_mc_other_buckets_body, world_size=1, args=(mc_saved["path"],), timeout=300)[0]
    assert "untyped" not in result and "loaded" not in result, result
    assert "bucket segments [0, 5, 10, 15, 20, 25, 30]" in result["error"], result["error"]
    assert "[0, 10, 20, 30] (buckets=3)" in result["error"] and "nothing was loaded" in result["error"]
    assert mc_saved["path"] in result["error"]
    assert result["changed"] == []


def test_mc_state_dict_of_other_buckets_changes_nothing_in_plain_load_state_dict() -> None:
    trained = _mc_model(MC_BUCKETS, "cpu")
    trained.mc(_kjt(torch.arange(0, 10**6, 10**5)))
    with torch.no_grad():
        trained.mc._embedding_module.embedding_bags["t0"].weight.add_(1.0)  # weights unlike the target's
    other = _mc_model(3, "cpu")
    before = _snapshot(other)
    with pytest.raises(ValueError, match=r"bucket segments \[0, 5, 10, 15, 20, 25, 30\].*\(buckets=3\)"):
        other.load_state_dict(trained.state_dict())
    assert _changed(before, other) == []  # the embedding weights in front of the id map too


def test_mc_state_with_ids_in_wrong_buckets_is_refused_before_the_module_changes() -> None:
    trained = _mc_model(MC_BUCKETS, "cpu")
    trained.mc(_kjt(torch.arange(0, 10**6, 10**5)))
    state = trained.state_dict()
    key = "mc._managed_collision_collection._managed_collision_modules.t0._mch_sorted_raw_ids"
    ids = state[key].clone()
    occupied = int(torch.nonzero(ids != 2**63 - 1)[0])
    ids[occupied] = 999_999  # an id of the last bucket in a row of another one
    state[key] = ids
    target = _mc_model(MC_BUCKETS, "cpu")
    before = _snapshot(target)
    with pytest.raises(ValueError, match="ids sit in rows of another bucket"):
        target.load_state_dict(state)
    assert _changed(before, target) == []


def _mc_full_other_buckets_body(rank: int, world: int, full: dict[str, torch.Tensor], buckets: int) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel

    dmp = DistributedModelParallel(_mc_model(buckets, "meta"))
    pooled, _ = dmp.module.mc(_kjt(torch.tensor([5, 500_000])))  # some state of its own
    pooled.wait()
    with torch.no_grad():
        for p in dmp.parameters():
            p.add_(1.0)  # weights unlike the saved ones: a copy would show
    before = _snapshot(dmp)
    out: dict[str, Any] = {}
    try:
        dmp.load_state_dict(full)
        out["loaded"] = True
    except ValueError as e:
        out["error"] = str(e)
    out["changed"] = _changed(before, dmp)
    return out


@pytest.mark.parametrize(("world", "buckets"), [(1, 3), (2, 2)])
def test_mc_full_state_of_other_buckets_changes_nothing_in_the_sharded_load_state_dict(
    mc_saved: dict[str, Any], world: int, buckets: int
) -> None:
    """``DistributedModelParallel.load_state_dict`` of a full state dict (``gather_full_state_dict``)
    saved with 6 buckets into a model of other buckets: refused before the embedding table in front
    of the id map is copied, on every rank (each holds rows of the table)."""
    args = (mc_saved["full"], buckets)
    for result in run_ranks(_mc_full_other_buckets_body, world_size=world, args=args, timeout=300):
        assert "loaded" not in result, result
        assert "bucket segments [0, 5, 10, 15, 20, 25, 30]" in result["error"], result["error"]
        assert result["changed"] == []


# ---- 2. a sharded checkpoint folder into the unsharded model ------------------------------------
def _dlrm_save_body(rank: int, world_size: int, path: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    model, optimizer, scheduler = _build(world_size)
    _step(model, optimizer, scheduler, 0, rank, world_size)
    ckpt = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
    save_sharded_checkpoint(path, ckpt, model, [optimizer])
    return model.gather_full_state_dict(dst=0)


@pytest.fixture(scope="module")
def dlrm_saved(tmp_path_factory: Any) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("dlrm") / "ckpt")
    assert _plan(2) is not None
    full = run_ranks(_dlrm_save_body, 2, args=(path,), timeout=300)[0]
    return {"path": path, "full": full}


def test_sharded_folder_loads_into_the_unsharded_model(dlrm_saved: dict[str, Any]) -> None:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    plain = _dlrm("cpu")
    plain.load_state_dict(load_sharded_checkpoint(dlrm_saved["path"], plain)["state_dict"])
    after = plain.state_dict()
    assert sorted(after) == sorted(dlrm_saved["full"])
    for key, value in dlrm_saved["full"].items():
        assert torch.equal(after[key], value), key


def test_sharded_folder_refuses_table_optimizer_state_torch_cannot_take(dlrm_saved: dict[str, Any]) -> None:
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint

    plain = _dlrm("cpu")
    opt = torch.optim.Adagrad(plain.parameters(), lr=0.1)  # no state yet; the tables' is fused row-wise Adagrad's
    # (its one group matches the tables' saved group, whose hyper-parameters are the fused kernels')
    with pytest.raises(CheckpointError, match=r"stepped by Adagrad, whose hyper-parameters \[.*'lr_decay'.*\] the "
                                              r"checkpoint's group lacks.*another optimizer.*nothing was loaded"):  # fmt: skip
        load_sharded_checkpoint(dlrm_saved["path"], plain, [opt])


def test_sharded_mc_folder_loads_into_the_unsharded_model(mc_saved: dict[str, Any]) -> None:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    plain = _mc_model(MC_BUCKETS, "cpu")
    plain.load_state_dict(load_sharded_checkpoint(mc_saved["path"], plain)["state_dict"])
    after = plain.state_dict()
    for key, value in mc_saved["full"].items():
        assert torch.equal(after[key].reshape(-1), value.reshape(-1)), key
    plain.eval()
    pooled, _ = plain.mc(_kjt(torch.tensor([0, 1001, 555000])))  # the loaded id map serves lookups
    assert pooled.values().shape == (3, 4)


def test_sharded_mc_folder_of_other_buckets_is_refused_by_the_unsharded_model(mc_saved: dict[str, Any]) -> None:
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint

    plain = _mc_model(3, "cpu")
    with pytest.raises(CheckpointError, match=r"bucket segments .*\(buckets=3\).*nothing was loaded"):
        load_sharded_checkpoint(mc_saved["path"], plain)


# ---- 3. a dense optimizer of another type, live state not created yet ----------------------------
def _dense_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, first: int = 0) -> list[float]:
    losses = []
    for s in range(first, first + steps):
        g = torch.Generator().manual_seed(s)
        loss = model(torch.randn(8, 3, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _adam_model(keyed: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A fresh dense model and its Adam, plain or behind a ``KeyedOptimizerWrapper``."""
    from lightrec.optim import KeyedOptimizerWrapper

    model = _dense_model()
    if keyed:
        return model, KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.Adam(ps, lr=0.01))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _save_adam(path: Path, keyed: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    model, opt = _adam_model(keyed)
    _train(model, opt, 3)
    save_sharded_checkpoint(str(path), {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]},
                            model, [opt])  # fmt: skip
    return model, opt


def test_dense_optimizer_of_another_type_is_refused_before_its_first_step(tmp_path: Path) -> None:
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint

    _save_adam(tmp_path / "ckpt", keyed=False)
    model = _dense_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # lazy: no state until it steps
    with pytest.raises(CheckpointError, match=r"stepped by SGD, whose hyper-parameters \['dampening', 'momentum', "
                                              r"'nesterov'\] the checkpoint's group lacks.*another optimizer.*"
                                              r"nothing was loaded"):  # fmt: skip
        load_sharded_checkpoint(tmp_path / "ckpt", model, [sgd])


class _HandWrittenAdam(torch.optim.Optimizer):
    """Adam's hyper-parameters, its own state names: only the state tells it from torch's Adam."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.sub_(group["lr"] * st["m"] / (st["v"].sqrt() + group["eps"]))


@pytest.mark.parametrize("keyed", [False, True])
def test_dense_optimizer_state_names_are_compared_before_its_first_step(tmp_path: Path, keyed: bool) -> None:
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint
    from lightrec.optim import KeyedOptimizerWrapper

    _save_adam(tmp_path / "ckpt", keyed)
    model = _dense_model()
    opt: torch.optim.Optimizer = (
        KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: _HandWrittenAdam(ps, lr=0.01))
        if keyed
        else _HandWrittenAdam(model.parameters(), lr=0.01)
    )
    with pytest.raises(CheckpointError, match=r"no state for '0\.weight' yet and creates \['m', 't', 'v'\] at its "
                                              r"first step, but the checkpoint holds \['exp_avg', 'exp_avg_sq', "
                                              r"'step'\].*nothing was loaded"):  # fmt: skip
        load_sharded_checkpoint(tmp_path / "ckpt", model, [opt])


@pytest.mark.parametrize("keyed", [False, True])
def test_fresh_optimizer_of_the_saved_type_resumes_exactly(tmp_path: Path, keyed: bool) -> None:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    reference, ref_opt = _save_adam(tmp_path / "ckpt", keyed)
    expected = _train(reference, ref_opt, 2, first=3)
    model, opt = _adam_model(keyed)
    ckpt = load_sharded_checkpoint(tmp_path / "ckpt", model, [opt])
    model.load_state_dict(ckpt["state_dict"])
    opt.load_state_dict(ckpt["optimizer_states"][0])
    assert _train(model, opt, 2, first=3) == expected


# ---- a checkpoint one rank cannot open ----------------------------------------------------------
def _open_on_one_rank_body(rank: int, world_size: int, path: str) -> str:
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint

    model = _dense_model()
    try:
        load_sharded_checkpoint(path if rank == 0 else path + "-not-on-this-host", model)
    except CheckpointError as e:
        return str(e)
    return "loaded"


def test_checkpoint_one_rank_cannot_open_fails_every_rank(tmp_path: Path) -> None:
    _save_adam(tmp_path / "ckpt", keyed=False)
    results = run_ranks(_open_on_one_rank_body, 2, args=(str(tmp_path / "ckpt"),), timeout=120)
    for message in results:  # rank 0 opened it, and must not wait for rank 1 forever
        assert "rank 1: FileNotFoundError: checkpoint" in message and "-not-on-this-host' does not exist" in message
