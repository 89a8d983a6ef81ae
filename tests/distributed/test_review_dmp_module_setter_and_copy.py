"""``DistributedModelParallel.module = m`` and ``DistributedModelParallel.copy(device)`` (torchrec's
surface) on 2 gloo ranks.

* ``dmp.module = new`` replaces the model (forward, state dict, children, plan, pipeline follow
  ``new``) instead of registering a stray child named ``module`` that nothing uses; it is refused
  once DDP wraps the old model, and for a value that is not a module.
* ``dmp.copy(device)`` is an independent copy: the same outputs and state, no shared storage,
  training either one (every model-parallel sharding type, fused row-wise Adagrad) leaves the other
  as it was; another device is refused by name. Data-parallel tables train in the copy too: their
  in-backward update hooks (which a deep-copied Parameter drops) are installed again on the copy's
  replicas, with the copy's own optimizer state.

One pair of ranks runs every check (a module-scoped fixture): starting ranks is the slow part.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.test_review_dmp_state_and_surface import _dmp, _inputs, _model
from tests.multiprocess import run_ranks


def _setter_case(rank: int, world_size: int) -> dict[str, Any]:
    dmp = _dmp(_model(), world_size, init_data_parallel=False)
    old = dmp.module
    new = _model()
    with torch.no_grad():
        new.lin.weight.add_(1.0)  # another dense layer than the old model's
    new.ebc, new.ec = old.ebc, old.ec  # the sharded collections, taken over
    dmp.module = new
    pooled, sequence = _inputs(rank)
    got, want, before = dmp(pooled, sequence)[0], new(pooled, sequence)[0], old(pooled, sequence)[0]
    out: dict[str, Any] = {
        "is_new": dmp.module is new,
        "children": [name for name, _ in dmp.named_children()],
        "keys": list(dmp.state_dict()) == list(_model().state_dict()),
        "lin": torch.equal(dmp.state_dict()["lin.weight"], new.lin.weight),
        "forward": torch.equal(got, want) and not torch.equal(got, before),
        "plan": sorted(dmp.plan.plan),
        "pipeline": [c is new.ebc or c is new.ec for c in dmp.pipeline.collections],
    }
    refusals = []
    for value in (3, dmp):
        try:
            dmp.module = value
            refusals.append("")
        except TypeError as e:
            refusals.append(str(e))
    dmp.init_data_parallel()  # 2 ranks, a trainable dense layer: DDP wraps `new`
    try:
        dmp.module = _model()
        refusals.append("")
    except RuntimeError as e:
        refusals.append(str(e))
    out["refusals"] = refusals
    out["still_new"] = dmp.module is new and [n for n, _ in dmp.named_children()] == ["_dmp_wrapped_module"]
    return out


def _full(dmp: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in dmp.gather_full_state_dict().items()}


def _train_step(dmp: Any, rank: int) -> None:
    pooled, sequence = _inputs(rank)
    score, seq = dmp(pooled, sequence)
    (score.sum() + seq.sum()).backward()  # tables: the fused optimizer steps in the backward
    with torch.no_grad():
        dmp.module.lin.weight.sub_(0.5 * dmp.module.lin.weight.grad)
    dmp.module.lin.weight.grad = None


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k in a if not torch.equal(a[k], b[k]))


def _model_parallel_dmp(world_size: int) -> Any:
    """The model with every model-parallel sharding type (no data-parallel table), DDP-wrapped dense part."""
    from lightrec.distributed import (
        DistributedModelParallel,
        EmbeddingBagCollectionSharder,
        EmbeddingCollectionSharder,
        ShardingPlan,
    )
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        row_wise,
        table_row_wise,
        table_wise,
    )
    from lightrec.optim import EmbOptimType

    model = _model()
    kinds = [row_wise(), table_wise(rank=1), column_wise(ranks=[1, 0]), table_wise(rank=0), table_row_wise(0)]
    plan = ShardingPlan({
        "ebc": construct_module_sharding_plan(model.ebc, {f"t{i}": g for i, g in enumerate(kinds)}, world_size=world_size),
        "ec": construct_module_sharding_plan(model.ec, {f"s{i}": g for i, g in enumerate(kinds)}, world_size=world_size),
    })  # fmt: skip
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.5}
    sharders = [EmbeddingBagCollectionSharder(fused), EmbeddingCollectionSharder(fused)]
    return DistributedModelParallel(model, device="cpu", plan=plan, sharders=sharders)


def _copy_case(rank: int, world_size: int) -> dict[str, Any]:
    dmp = _model_parallel_dmp(world_size)
    twin = dmp.copy(torch.device("cpu"))
    pooled, sequence = _inputs(rank)
    same_out = all(torch.equal(a, b) for a, b in zip(dmp(pooled, sequence), twin(pooled, sequence)))
    start, twin_start = _full(dmp), _full(twin)
    ptrs = {p.data_ptr() for p in dmp.parameters() if p.numel()}
    twin_ptrs = {p.data_ptr() for p in twin.parameters() if p.numel()}
    _train_step(twin, rank)
    after_twin, twin_trained = _full(dmp), _full(twin)
    _train_step(dmp, rank)
    after_dmp, twin_after_dmp = _full(dmp), _full(twin)
    try:
        dmp.copy("meta")
        refused = ""
    except ValueError as e:
        refused = str(e)
    return {
        "type": type(twin).__name__,
        "same_out": same_out,
        "same_state": list(start) == list(twin_start) and not _changed(start, twin_start),
        "shared_storage": len(ptrs & twin_ptrs),
        "wrapped": (dmp.data_parallel is not None, twin.data_parallel is not None),
        "fused_paths": sorted({k.split(".")[0] for k in twin.fused_optimizer.params}),
        "original_moved_by_twin": _changed(start, after_twin),
        "twin_moved": _changed(start, twin_trained),
        "twin_moved_by_original": _changed(twin_trained, twin_after_dmp),
        "original_moved": _changed(start, after_dmp),
        # one step from the same state, the same tables (the dense layer differs: the copy has no DDP)
        "same_step": _changed(twin_trained, after_dmp) == ["lin.weight"],
        "refused": refused,
    }


def _data_parallel_copy_case(rank: int, world_size: int) -> dict[str, Any]:
    """A model with data-parallel tables t3 and s3 (fused row-wise Adagrad): the copy trains them."""
    from lightrec.distributed import (
        DistributedModelParallel,
        EmbeddingBagCollectionSharder,
        EmbeddingCollectionSharder,
    )
    from lightrec.optim import EmbOptimType
    from tests.distributed.test_review_dmp_state_and_surface import _plan

    model = _model()
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.5}
    sharders = [EmbeddingBagCollectionSharder(fused), EmbeddingCollectionSharder(fused)]
    dmp = DistributedModelParallel(model, device="cpu", plan=_plan(model, world_size), sharders=sharders)
    twin = dmp.copy("cpu")
    replicas = ("ebc.embedding_bags.t3.weight", "ec.embeddings.s3.weight")
    start = _full(dmp)
    state_before = {k: _cloned(v) for k, v in twin.fused_optimizer.state_dict()["state"].items() if "3" in k}
    _train_step(twin, rank)
    original_state = _cloned(dmp.fused_optimizer.state_dict()["state"])  # live views: cloned before dmp trains
    after_twin, twin_trained = _full(dmp), _full(twin)
    state_after = _cloned(twin.fused_optimizer.state_dict()["state"])
    _train_step(dmp, rank)
    after_dmp = _full(dmp)
    return {
        "dp_state_keys": sorted(state_before),
        "twin_moved": [k for k in replicas if not torch.equal(start[k], twin_trained[k])],
        "original_moved_by_twin": _changed(start, after_twin),
        "same_step": _changed(twin_trained, after_dmp) == ["lin.weight"],
        "twin_state_moved": sorted(k for k, v in state_before.items() if not _same_state(v, state_after[k])),
        "original_state_moved": sorted(k for k, v in state_before.items() if not _same_state(v, original_state[k])),
    }


def _cloned(state: Any) -> Any:
    return state.clone() if isinstance(state, torch.Tensor) else {k: _cloned(v) for k, v in state.items()}


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(_same_state(a[k], b[k]) for k in a)


def _body(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "setter": _setter_case(rank, world_size),
        "copy": _copy_case(rank, world_size),
        "dp_copy": _data_parallel_copy_case(rank, world_size),
    }


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_body, 2, timeout=300)


def test_setting_module_replaces_the_model(results: list[dict[str, Any]]) -> None:
    for r in results:
        s = r["setter"]
        assert s["is_new"], "dmp.module = new left the old model in place"
        assert s["children"] == ["_dmp_wrapped_module"]  # no stray child "module"
        assert s["keys"] and s["lin"] and s["forward"]
        assert s["plan"] == ["ebc", "ec"] and s["pipeline"] == [True, True]


def test_setting_module_refuses_non_modules_and_a_ddp_wrapped_model(results: list[dict[str, Any]]) -> None:
    for r in results:
        s = r["setter"]
        not_module, dmp_itself, after_ddp = s["refusals"]
        assert "unwrapped model" in not_module and "int" in not_module
        assert "DistributedModelParallel" in dmp_itself
        assert "init_data_parallel=False" in after_ddp
        assert s["still_new"]


def test_copy_is_an_independent_model_on_the_same_device(results: list[dict[str, Any]]) -> None:
    for r in results:
        c = r["copy"]
        assert c["type"] == "DistributedModelParallel"
        assert c["same_out"] and c["same_state"]
        assert c["shared_storage"] == 0
        assert c["wrapped"] == (True, False)  # the copy is not data parallel until init_data_parallel()
        assert c["fused_paths"] == ["ebc", "ec"]
        assert c["original_moved_by_twin"] == [] and c["twin_moved_by_original"] == []
        assert "lin.weight" in c["twin_moved"] and "lin.weight" in c["original_moved"]
        assert any(k.startswith("ebc.") for k in c["twin_moved"]) and any(k.startswith("ec.") for k in c["twin_moved"])
        assert c["twin_moved"] == c["original_moved"]  # the same step from the same state
        assert c["same_step"]


def test_copy_to_another_device_is_refused(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert "copy(device=meta)" in r["copy"]["refused"] and "do not move" in r["copy"]["refused"]


def test_copy_trains_data_parallel_tables_with_its_own_state(results: list[dict[str, Any]]) -> None:
    for r in results:
        c = r["dp_copy"]
        assert c["dp_state_keys"], "the copy's fused optimizer has no state for the data-parallel tables"
        # The copy's step moves its replicas (the hooks came back) and leaves the original alone ...
        assert c["twin_moved"] == ["ebc.embedding_bags.t3.weight", "ec.embeddings.s3.weight"]
        assert c["original_moved_by_twin"] == []
        # ... with the copy's optimizer state, and exactly as the original's own step does.
        assert c["twin_state_moved"] == c["dp_state_keys"] and c["original_state_moved"] == []
        assert c["same_step"]
