"""DistributedModelParallel's state dict and torchrec surface on 2 gloo ranks, against the unsharded model.

A model with an ``EmbeddingBagCollection`` and an ``EmbeddingCollection`` (every sharding type:
row-, table-, column-, table-row-wise and data-parallel) beside a dense layer:

* an unsharded state dict loads into the sharded model and gathers back to the same tensors; the
  sharded forward equals the unsharded one's on each rank's samples;
* a state dict that lacks tables reports them missing under the unsharded model's keys (the keys
  ``state_dict()`` has), as the unsharded model does, under ``strict=False`` and in strict's error;
* ``load_state_dict(..., assign=True)`` loads the tables into the live shards (the lookups, the
  state dict and the fused optimizer see the loaded values; the parameters stay the same objects);
* torchrec's ``init_data_parallel()`` wraps the dense part lazily (once), after which the dense
  gradient is the gradient of the mean of the per-rank losses;
* torchrec's ``load_state_dict(state_dict, prefix=...)``; a prefix passed positionally (torchrec's
  order) is refused by name instead of being taken for ``strict``.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.multiprocess import run_ranks

ROWS = 11
DIM = 8
N = 5  # tables per collection (one per sharding type)


def _model() -> Any:
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection([
                EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=DIM, name=f"t{i}", feature_names=[f"f{i}"])
                for i in range(N)
            ])  # fmt: skip
            self.ec = EmbeddingCollection([
                EmbeddingConfig(num_embeddings=ROWS, embedding_dim=DIM, name=f"s{i}", feature_names=[f"g{i}"])
                for i in range(N)
            ])  # fmt: skip
            self.lin = torch.nn.Linear(N * DIM, 1)

        def forward(self, pooled: Any, sequence: Any) -> tuple[torch.Tensor, torch.Tensor]:
            kt = self.ebc(pooled)
            jts = self.ec(sequence)
            seq = torch.cat([jts[f"g{i}"].values() for i in range(N)])
            return self.lin(kt.values()).squeeze(1), seq

    torch.manual_seed(0)
    return Model()


def _plan(model: Any, world_size: int) -> Any:
    from lightrec.distributed import ShardingPlan
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )

    def gens(p: str) -> dict[str, Any]:
        kinds = [row_wise(), table_wise(rank=1), column_wise(ranks=[1, 0]), data_parallel(), table_row_wise(0)]
        return {f"{p}{i}": g for i, g in enumerate(kinds)}

    return ShardingPlan({
        "ebc": construct_module_sharding_plan(model.ebc, gens("t"), world_size=world_size),
        "ec": construct_module_sharding_plan(model.ec, gens("s"), world_size=world_size),
    })  # fmt: skip


def _dmp(model: Any, world_size: int, **kwargs: Any) -> Any:
    from lightrec.distributed import (
        DistributedModelParallel,
        EmbeddingBagCollectionSharder,
        EmbeddingCollectionSharder,
    )
    from lightrec.optim import EmbOptimType

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5}
    sharders = [EmbeddingBagCollectionSharder(fused), EmbeddingCollectionSharder(fused)]
    return DistributedModelParallel(model, device="cpu", plan=_plan(model, world_size), sharders=sharders, **kwargs)


def _inputs(rank: int) -> tuple[Any, Any]:
    """This rank's pooled and sequence KJTs (3 samples, 0-2 ids a bag, a different draw per rank)."""
    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(10 + rank)
    out = []
    for prefix in ("f", "g"):
        lengths = torch.randint(0, 3, (N * 3,), generator=g)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        out.append(KeyedJaggedTensor([f"{prefix}{i}" for i in range(N)], values, lengths=lengths, stride=3))
    return out[0], out[1]


def _shifted(model: Any, by: float) -> dict[str, torch.Tensor]:
    """``model``'s state dict with ``by`` added to every float tensor (values no sharded model holds yet)."""
    return {k: v + by if v.is_floating_point() else v for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
def _round_trip_body(rank: int, world_size: int) -> dict[str, Any]:
    reference = _model()
    dmp = _dmp(_model(), world_size)
    target = _shifted(reference, 0.25)
    reference.load_state_dict(target)
    loaded = dmp.load_state_dict(target, strict=True)
    full = dmp.gather_full_state_dict()
    pooled, sequence = _inputs(rank)
    got, ref = dmp(pooled, sequence), reference(pooled, sequence)
    back = _model()
    back.load_state_dict(full, strict=True)
    return {
        "keys": (list(dmp.state_dict()), list(reference.state_dict())),
        "incompatible": (loaded.missing_keys, loaded.unexpected_keys),
        "gather_err": max((full[k] - v).abs().max().item() for k, v in target.items()),
        "forward_err": max((a - b).abs().max().item() for a, b in zip(got, ref)),
        "back_err": max((back.state_dict()[k] - v).abs().max().item() for k, v in target.items()),
    }


def test_unsharded_state_dict_loads_into_every_sharding_type_and_gathers_back() -> None:
    for r in run_ranks(_round_trip_body, 2, timeout=240):
        assert r["keys"][0] == r["keys"][1]
        assert r["incompatible"] == ([], [])
        assert r["gather_err"] == 0.0 and r["back_err"] == 0.0
        assert r["forward_err"] < 1e-6


# ---------------------------------------------------------------------------------------------
def _missing_body(rank: int, world_size: int) -> dict[str, Any]:
    reference = _model()
    dmp = _dmp(_model(), world_size)
    dropped = {"ebc.embedding_bags.t0.weight", "ebc.embedding_bags.t2.weight", "ec.embeddings.s3.weight",
               "ec.embeddings.s4.weight", "lin.bias"}  # fmt: skip
    partial = {k: v for k, v in reference.state_dict().items() if k not in dropped}
    got = dmp.load_state_dict(partial, strict=False)
    expected = reference.load_state_dict(partial, strict=False)
    try:
        dmp.load_state_dict(partial)
        strict_error = ""
    except RuntimeError as e:
        strict_error = str(e)
    return {"got": got.missing_keys, "expected": expected.missing_keys, "unexpected": got.unexpected_keys,
            "strict_error": strict_error}  # fmt: skip


def test_missing_tables_are_reported_under_the_unsharded_keys() -> None:
    for r in run_ranks(_missing_body, 2, timeout=240):
        assert sorted(r["got"]) == sorted(r["expected"]), r
        assert r["unexpected"] == []
        for key in r["expected"]:
            assert f'"{key}"' in r["strict_error"]
        assert "_lookups" not in r["strict_error"]


# ---------------------------------------------------------------------------------------------
def _assign_body(rank: int, world_size: int) -> dict[str, Any]:
    reference = _model()
    dmp = _dmp(_model(), world_size)
    params_before = dict(dmp.named_parameters())
    target = _shifted(reference, 0.5)
    reference.load_state_dict(target)
    dmp.load_state_dict(target, assign=True)
    full = dmp.gather_full_state_dict()
    pooled, sequence = _inputs(rank)
    got, ref = dmp(pooled, sequence), reference(pooled, sequence)
    params_after = dict(dmp.named_parameters())
    # one fused SGD step on the loaded tables: the gathered tables move by what plain SGD gives
    (got[0].sum() + got[1].sum()).backward()
    moved = dmp.gather_full_state_dict()
    return {
        "gather_err": max((full[k] - v).abs().max().item() for k, v in target.items()),
        "forward_err": max((a - b).abs().max().item() for a, b in zip(got, ref)),
        "same_params": sorted(k for k, p in params_after.items() if "_lookups" in k and params_before[k] is p),
        "table_params": sorted(k for k in params_after if "_lookups" in k),
        "moved": {k: (moved[k] - full[k]).abs().max().item() for k in full if "weight" in k and k != "lin.weight"},
    }


def test_assign_loads_the_tables_into_the_live_shards() -> None:
    for r in run_ranks(_assign_body, 2, timeout=240):
        assert r["gather_err"] == 0.0
        assert r["forward_err"] < 1e-6
        assert r["same_params"] == r["table_params"]
        assert all(v > 0 for v in r["moved"].values()), r["moved"]  # the fused optimizer updates the loaded rows


# ---------------------------------------------------------------------------------------------
def _lazy_ddp_body(rank: int, world_size: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    reference = _model()
    dmp = _dmp(_model(), world_size, init_data_parallel=False)
    before = dmp.data_parallel
    dmp.init_data_parallel()
    wrapped = dmp.data_parallel
    dmp.init_data_parallel()  # a second call changes nothing
    pooled, sequence = _inputs(rank)
    dmp(pooled, sequence)[0].sum().backward()
    # reference: the gradient of the mean over the ranks of each rank's loss
    losses = [reference(*_inputs(r))[0].sum() for r in range(world_size)]
    (sum(losses) / world_size).backward()
    assert reference.lin.weight.grad is not None
    grad = dmp.module.lin.weight.grad
    return {
        "before": before is None,
        "wrapped": isinstance(wrapped, DistributedDataParallel),
        "same": dmp.data_parallel is wrapped,
        "grad_err": (grad - reference.lin.weight.grad).abs().max().item(),
        "keys": list(dmp.state_dict()) == list(reference.state_dict()),
    }


def test_init_data_parallel_wraps_the_dense_part_once() -> None:
    for r in run_ranks(_lazy_ddp_body, 2, timeout=240):
        assert r["before"] and r["wrapped"] and r["same"] and r["keys"]
        assert r["grad_err"] < 1e-5


# ---------------------------------------------------------------------------------------------
def _prefix_body(rank: int, world_size: int) -> dict[str, Any]:
    reference = _model()
    dmp = _dmp(_model(), world_size)
    target = _shifted(reference, 1.0)
    prefixed = {f"model.{k}": v for k, v in target.items()}
    loaded = dmp.load_state_dict(prefixed, prefix="model.")
    full = dmp.gather_full_state_dict()
    saved = dmp.state_dict(prefix="model.")
    again = dmp.load_state_dict(saved, prefix="model.")
    try:
        dmp.load_state_dict(prefixed, "model.")
        refused = ""
    except TypeError as e:
        refused = str(e)
    return {
        "incompatible": (loaded.missing_keys, loaded.unexpected_keys, again.missing_keys, again.unexpected_keys),
        "err": max((full[k] - v).abs().max().item() for k, v in target.items()),
        "refused": refused,
    }


def test_load_state_dict_takes_torchrecs_prefix_by_keyword() -> None:
    for r in run_ranks(_prefix_body, 2, timeout=240):
        assert r["incompatible"] == ([], [], [], [])
        assert r["err"] == 0.0
        assert "strict" in r["refused"] and "'model.'" in r["refused"] and "prefix=" in r["refused"]


def test_single_rank_init_data_parallel_is_a_no_op() -> None:
    (result,) = run_ranks(_single_body, 1, timeout=120)
    assert result == {"before": True, "wrapped": False}


def _single_body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel, ShardingPlan
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise

    model = _model()
    plan = ShardingPlan({
        "ebc": construct_module_sharding_plan(model.ebc, {f"t{i}": table_wise(rank=0) for i in range(N)}, world_size=1),
        "ec": construct_module_sharding_plan(model.ec, {f"s{i}": table_wise(rank=0) for i in range(N)}, world_size=1),
    })  # fmt: skip
    dmp = DistributedModelParallel(model, device="cpu", plan=plan, init_data_parallel=False)
    before = dmp.data_parallel is None
    dmp.init_data_parallel()
    return {"before": before, "wrapped": dmp.data_parallel is not None}
