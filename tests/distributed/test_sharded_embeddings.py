"""Sharded EBC / EC on real gloo ranks (and, with ``-m gpu``, on CUDA with NCCL) against unsharded
references: every sharding type.

One process-group launch per world size (2 and 3) runs every case. For each case every rank
builds the same *global* batches (deterministic), keeps its own slice (ranks have different batch
sizes), and compares

* the forward output of the sharded module with the unsharded module's rows for its samples;
* after a few training steps with the fused optimizer (SGD and row-wise Adagrad), the gathered
  full tables with an unsharded module trained by hand (dense gradients, hand-written update) on
  the loss ``mean over ranks of (mean over the rank's samples)`` -- lightrec's documented
  gradient semantics (docs/sharding.md).

Tables are uneven on purpose: a table smaller than the world size, row counts and widths not
divisible by it, two features sharing one table, empty bags, ranks owning no table.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.multiprocess import run_nccl, run_ranks

STEPS = 3
LR = 0.1
TOL = 2e-5


# ---------------------------------------------------------------------------------------------
# Problem definition (shared with test_dmp*.py)


def table_configs(pooled: bool, world_size: int) -> list[Any]:
    """Three tables: A (13 x 8, SUM, features a1 and a2 share it), B (2 x 4 rows < world, MEAN),
    C (11 x 6, SUM: 6 columns do not split into 4-aligned shards)."""
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    if pooled:
        return [
            EmbeddingBagConfig(num_embeddings=13, embedding_dim=8, name="A", feature_names=["a1", "a2"]),
            EmbeddingBagConfig(
                num_embeddings=2, embedding_dim=4, name="B", feature_names=["b"], pooling=PoolingType.MEAN
            ),
            EmbeddingBagConfig(num_embeddings=11, embedding_dim=6, name="C", feature_names=["c"]),
        ]
    return [
        EmbeddingConfig(num_embeddings=13, embedding_dim=4, name="A", feature_names=["a1", "a2"]),
        EmbeddingConfig(num_embeddings=2, embedding_dim=4, name="B", feature_names=["b"]),
        EmbeddingConfig(num_embeddings=11, embedding_dim=6, name="C", feature_names=["c"]),
    ]


def batch_sizes(world_size: int, equal: bool | str) -> list[int]:
    """Per-rank batch sizes: equal, unequal, or ``"zero"``: rank 1 has no samples this step."""
    if equal == "zero":
        return [0 if r == 1 else 2 + r for r in range(world_size)]
    return [3] * world_size if equal else [2 + r for r in range(world_size)]


def max_abs(diff: torch.Tensor) -> float:
    return diff.abs().max().item() if diff.numel() else 0.0


def mean_or_zero(losses: torch.Tensor) -> torch.Tensor:
    """Mean over samples; 0 (with a gradient path) for a rank that has none."""
    return losses.sum() / max(1, losses.shape[0])


def global_batch(step: int, world_size: int, equal: bool | str, weighted: bool, seed: int = 0) -> list[Any]:
    """Per-rank KJTs of one step (keys in a shuffled order; empty bags included)."""
    from lightrec.sparse import KeyedJaggedTensor

    rows = {"a1": 13, "a2": 13, "b": 2, "c": 11}
    keys = ["c", "a1", "b", "a2"]  # not the collection's order: the sharded module must permute
    g = torch.Generator().manual_seed(1000 * seed + 17 * step + world_size)
    out = []
    for batch in batch_sizes(world_size, equal):
        lengths = torch.randint(0, 4, (len(keys), batch), generator=g)
        if batch:
            lengths[0, 0] = 0  # an empty bag on every rank
        values = torch.cat(
            [torch.randint(0, rows[k], (int(lengths[i].sum()),), generator=g) for i, k in enumerate(keys)]
        )
        weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
        out.append(KeyedJaggedTensor(keys, values, weights, lengths=lengths.reshape(-1), stride=batch))
    return out


def concat_kjts(kjts: list[Any]) -> Any:
    """One KJT holding every rank's samples, rank after rank (the global batch)."""
    from lightrec.sparse import KeyedJaggedTensor

    keys = kjts[0].keys()
    per_key = [k.to_dict() for k in kjts]
    lengths = torch.cat([d[key].lengths() for key in keys for d in per_key])
    values = torch.cat([d[key].values() for key in keys for d in per_key])
    weighted = kjts[0].weights_or_none() is not None
    weights = torch.cat([d[key].weights() for key in keys for d in per_key]) if weighted else None
    return KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride=sum(k.stride() for k in kjts))


def plan_generators(kind: str, world_size: int, pooled: bool) -> dict[str, Any]:
    """``{table: generator}`` of one sharding kind (``mixed``: a different type per table)."""
    from lightrec.distributed.planner import (
        column_wise,
        data_parallel,
        row_wise,
        table_column_wise,
        table_row_wise,
        table_wise,
    )

    last = world_size - 1
    gens = {
        "data_parallel": lambda t: data_parallel(),
        "row_wise": lambda t: row_wise(),
        "table_row_wise": lambda t: table_row_wise(host_index=0),
        "table_column_wise": lambda t: table_column_wise(host_index=0),
    }
    if kind in gens:
        return {t: gens[kind](t) for t in "ABC"}
    if kind == "table_wise":  # A and C on the last rank, B on rank 0: the output needs a permute
        return {"A": table_wise(rank=last), "B": table_wise(rank=0), "C": table_wise(rank=last)}
    if kind == "table_wise_one_rank":  # every other rank owns no table
        return {t: table_wise(rank=0) for t in "ABC"}
    if kind == "column_wise":  # a rank holding two column shards of one table
        return {
            "A": column_wise(ranks=[last, 0, last]),
            "B": column_wise(ranks=[0, last]),
            "C": column_wise(ranks=[last, 0]),
        }
    if kind == "mixed":
        return {"A": row_wise(), "B": data_parallel(), "C": column_wise(ranks=[0, last])}
    if kind == "dense_kernels":  # plain autograd gradients; the test steps SGD by hand
        return {"A": row_wise(compute_kernel="dense"), "B": table_wise(rank=last, compute_kernel="dense"),
                "C": column_wise(ranks=[last, 0], compute_kernel="dense")}  # fmt: skip
    raise ValueError(kind)


KINDS = [
    "data_parallel", "table_wise", "table_wise_one_rank", "row_wise", "column_wise",
    "table_row_wise", "table_column_wise", "mixed", "dense_kernels",
]  # fmt: skip


def fused_params(optimizer: str) -> dict[str, Any]:
    from lightrec.optim import EmbOptimType

    kind = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[optimizer]
    return {"optimizer": kind, "learning_rate": LR, "eps": 1e-8}


def column_blocks(plan: Any, table: str, dim: int) -> list[tuple[int, int]]:
    """Column ranges with their own row-wise Adagrad state: one per column shard (docs/sharding.md)."""
    ps = plan[table]
    if ps.sharding_type not in ("column_wise", "table_column_wise"):
        return [(0, dim)]
    return sorted({(s.shard_offsets[1], s.shard_offsets[1] + s.shard_sizes[1]) for s in ps.sharding_spec})


def reference_update(
    weight: torch.Tensor, grad: torch.Tensor, state: dict, optimizer: str, blocks: list[tuple[int, int]]
) -> None:
    """Hand-written fused-optimizer rule on a dense gradient (touched rows = non-zero gradient).

    Row-wise Adagrad keeps one accumulator per row and column block (a column shard sees only
    its own columns, as in fbgemm / torchrec)."""
    with torch.no_grad():
        rows = grad.ne(0).any(dim=1)
        if optimizer == "sgd":
            weight[rows] -= LR * grad[rows]
            return
        for lo, hi in blocks:
            m = state.setdefault((lo, hi), torch.zeros(weight.shape[0]))
            g = grad[rows, lo:hi]
            m[rows] += g.square().mean(dim=1)
            weight[rows, lo:hi] -= LR * g / (m[rows].sqrt() + 1e-8).unsqueeze(1)


def per_sample_loss(values: torch.Tensor, first_sample: int) -> torch.Tensor:
    """``[B]`` losses of pooled outputs ``[B, D]`` (targets depend on the global sample index)."""
    g = torch.Generator().manual_seed(7 + first_sample)
    target = torch.randn(values.shape[0] + 64, values.shape[1], generator=g)[: values.shape[0]]
    return ((values - target) ** 2).sum(dim=1)


# ---------------------------------------------------------------------------------------------
# Rank body


def _pooled_case(
    rank: int,
    world_size: int,
    kind: str,
    weighted: bool,
    optimizer: str,
    equal: bool | str,
    device: str = "cpu",
) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(5)
    ref = EmbeddingBagCollection(table_configs(True, world_size), is_weighted=weighted)
    plan = construct_module_sharding_plan(ref, plan_generators(kind, world_size, True), world_size=world_size)
    sharder = EmbeddingBagCollectionSharder(fused_params=fused_params(optimizer))
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = sharder.shard(ref, plan, env, torch.device(device))  # keeps ref's weights (on CPU)
    sizes = batch_sizes(world_size, equal)
    first = sum(sizes[:rank])
    errors = {"forward": 0.0, "tables": 0.0}
    states: dict[str, dict] = {}
    for step in range(STEPS):
        kjts = global_batch(step, world_size, equal, weighted)
        out = sharded(kjts[rank].to(device)).wait()
        loss = mean_or_zero(per_sample_loss(out.values().cpu(), first))
        # Reference: the global batch in one process, loss = mean over ranks of the per-rank means.
        ref_out = ref(concat_kjts(kjts))
        errors["forward"] = max(
            errors["forward"],
            max_abs(out.values().detach().cpu() - ref_out.values()[first : first + sizes[rank]]),
        )
        assert out.keys() == ref_out.keys()
        starts = [sum(sizes[:r]) for r in range(world_size)]
        ref_loss = (
            sum(mean_or_zero(per_sample_loss(ref_out.values()[s : s + b], s)) for s, b in zip(starts, sizes))
            / world_size
        )
        ref.zero_grad()
        ref_loss.backward()
        loss.backward()
        if kind == "dense_kernels":
            from lightrec.optim import in_backward_optimizer_filter

            dense = dict(in_backward_optimizer_filter(sharded.named_parameters()))
            assert len(dense) >= 1 and all(p.grad is not None for p in dense.values()), sorted(dense)
            with torch.no_grad():
                for p in dense.values():
                    p -= LR * p.grad
                    p.grad = None
        else:
            assert not dict(in_backward_optimizer_filter_names(sharded))
        for name, bag in ref.embedding_bags.items():
            blocks = column_blocks(plan, name, bag.weight.shape[1])
            reference_update(bag.weight, bag.weight.grad, states.setdefault(name, {}), optimizer, blocks)
    full = gather_full_state_dict(sharded.state_dict())
    for name, bag in ref.embedding_bags.items():
        errors["tables"] = max(
            errors["tables"],
            (full[f"embedding_bags.{name}.weight"].cpu() - bag.weight.detach()).abs().max().item(),
        )
    return errors


def in_backward_optimizer_filter_names(module: Any) -> Any:
    from lightrec.optim import in_backward_optimizer_filter

    return in_backward_optimizer_filter(module.named_parameters())


def _errors_case(rank: int, world_size: int) -> list[str]:
    """Typed errors for bad plans and bad state dicts; returns the messages."""
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardedTableState, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    ebc = EmbeddingBagCollection(table_configs(True, world_size))
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharder = EmbeddingBagCollectionSharder()
    messages = []
    partial = construct_module_sharding_plan(ebc, {"A": table_wise(rank=0)}, world_size=world_size)
    with pytest.raises(KeyError, match="missing") as e:
        sharder.shard(ebc, partial, env, "cpu")
    messages.append(str(e.value))
    with pytest.raises(TypeError, match="EmbeddingBagCollection") as e:
        sharder.shard(EmbeddingCollection(table_configs(False, world_size)), partial, env, "cpu")
    messages.append(str(e.value))
    bad = construct_module_sharding_plan(ebc, {t: row_wise() for t in "ABC"}, world_size=world_size)
    bad["A"].sharding_spec[0].shard_sizes[0] += 1  # rows no longer add up
    with pytest.raises(ValueError, match="add up") as e:
        sharder.shard(ebc, bad, env, "cpu")
    messages.append(str(e.value))
    # A sharded state dict loads only into the same layout; full tables load into any plan.
    tw = sharder.shard(
        ebc,
        construct_module_sharding_plan(ebc, {t: table_wise(rank=0) for t in "ABC"}, world_size=world_size),
        env,
        "cpu",
    )
    rw = sharder.shard(
        ebc,
        construct_module_sharding_plan(ebc, {t: row_wise() for t in "ABC"}, world_size=world_size),
        env,
        "cpu",
    )
    sd = tw.state_dict()
    assert isinstance(sd["embedding_bags.A.weight"], ShardedTableState)
    if rank == 0:
        with pytest.raises(ValueError, match="gather_full_state_dict") as e:
            rw.load_state_dict(sd)
        messages.append(str(e.value))
    with pytest.raises(ValueError, match="shape") as e:
        rw.load_state_dict({**ebc.state_dict(), "embedding_bags.A.weight": torch.zeros(3, 8)})
    messages.append(str(e.value))
    rw.load_state_dict(ebc.state_dict())  # full tables: fine
    return messages


def _sequence_case(
    rank: int, world_size: int, kind: str, optimizer: str, equal: bool | str = True, device: str = "cpu"
) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingCollection

    torch.manual_seed(6)
    ref = EmbeddingCollection(table_configs(False, world_size))
    plan = construct_module_sharding_plan(
        ref, plan_generators(kind, world_size, False), world_size=world_size
    )
    sharded = EmbeddingCollectionSharder(fused_params=fused_params(optimizer)).shard(
        ref, plan, ShardingEnv.from_process_group(dist.group.WORLD), torch.device(device)
    )
    sizes = batch_sizes(world_size, equal)
    # per-rank loss: a mean over the batch when batches are equal, else a plain sum (a rank may
    # have no samples); the global loss is the mean over ranks either way
    scale = 1.0 / sizes[rank] if equal is True else 1.0
    errors = {"forward": 0.0, "tables": 0.0}
    states: dict[str, dict] = {}

    def loss_of(jts: dict, scale: float) -> torch.Tensor:
        return (
            sum(((jt.values() - 0.3) ** 2).sum() * (i + 1) for i, (_, jt) in enumerate(sorted(jts.items())))
            * scale
        )

    for step in range(STEPS):
        kjts = global_batch(step, world_size, equal, False, seed=1)
        out = {f: jt.to(torch.device("cpu")) for f, jt in sharded(kjts[rank].to(device)).wait().items()}
        full_batch = concat_kjts(kjts)
        ref_out = ref(full_batch)
        # This rank's ids are a contiguous slice of each feature's ids in the global batch.
        for f, jt in out.items():
            lengths = ref_out[f].lengths()
            lo = int(lengths[: sum(sizes[:rank])].sum())
            mine = ref_out[f].values()[lo : lo + jt.values().shape[0]]
            assert torch.equal(jt.lengths(), lengths[sum(sizes[:rank]) : sum(sizes[: rank + 1])])
            errors["forward"] = max(
                errors["forward"], (jt.values() - mine).abs().max().item() if mine.numel() else 0.0
            )
        # Each rank's loss is a sum over its ids divided by its batch; the reference averages over ranks.
        loss_of(out, scale).backward()
        ref.zero_grad()
        (loss_of(ref_out, scale) / world_size).backward()
        for name, emb in ref.embeddings.items():
            blocks = column_blocks(plan, name, emb.weight.shape[1])
            reference_update(emb.weight, emb.weight.grad, states.setdefault(name, {}), optimizer, blocks)
    full = gather_full_state_dict(sharded.state_dict())
    for name, emb in ref.embeddings.items():
        errors["tables"] = max(
            errors["tables"],
            (full[f"embeddings.{name}.weight"].cpu() - emb.weight.detach()).abs().max().item(),
        )
    return errors


def _body(rank: int, world_size: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    results = {}
    for kind in KINDS:
        combos = [(False, "rowwise_adagrad", True), (True, "sgd", False), (True, "rowwise_adagrad", "zero")]
        if kind == "dense_kernels":
            combos = [(False, "sgd", True), (True, "sgd", False)]
        for weighted, optimizer, equal in combos:
            results[f"ebc/{kind}/weighted={weighted}/{optimizer}/equal_batches={equal}"] = _pooled_case(
                rank, world_size, kind, weighted, optimizer, equal, device
            )
        if kind == "dense_kernels":
            continue
        for optimizer, equal in (("sgd", True), ("rowwise_adagrad", "zero")):
            results[f"ec/{kind}/{optimizer}/equal_batches={equal}"] = _sequence_case(
                rank, world_size, kind, optimizer, equal, device
            )
    if device == "cpu":  # the typed errors do not depend on the device
        results["errors"] = {"messages": 0.0 if len(_errors_case(rank, world_size)) >= 4 else 1.0}
    return results


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: slow suite (CI budget)
def test_every_sharding_type_matches_unsharded_reference(world_size: int) -> None:
    per_rank = run_ranks(_body, world_size, timeout=240)
    failures = [
        f"rank {rank} {case}: {what} differs by {err:.3g}"
        for rank, results in enumerate(per_rank)
        for case, errs in results.items()
        for what, err in errs.items()
        if not err <= TOL
    ]
    assert not failures, "\n".join(failures)
    assert len(per_rank[0]) == (len(KINDS) - 1) * 5 + 2 + 1


@pytest.mark.gpu
def test_every_sharding_type_on_nccl_matches_unsharded_reference() -> None:
    """Every sharding type, EBC and EC, on CUDA with an NCCL group of size 1: forward outputs and
    the tables after 3 fused steps equal the unsharded CPU reference."""
    results = run_nccl(_body, args=("cuda",), timeout=300)
    failures = [
        f"{case}: {what} differs by {err:.3g}"
        for case, errs in results.items()
        for what, err in errs.items()
        if not err <= TOL
    ]
    assert not failures, "\n".join(failures)
    assert len(results) == (len(KINDS) - 1) * 5 + 2
