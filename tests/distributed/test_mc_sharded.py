"""Sharded managed-collision collections on real gloo ranks against the unsharded module.

Every rank builds the same global batches (raw 64-bit-style ids, a vocabulary that drifts so that
tables fill up and evict), keeps its slice, and trains the sharded module with a fused optimizer;
the reference is the unsharded ``ManagedCollisionEmbeddingBagCollection`` around a fused
collection with the same optimizer, trained on the whole batch with the loss ``mean over ranks``.
After every step the outputs and the remapped ids must be equal, and at the end the gathered
tables, id maps and eviction metadata -- so the remapping decisions, evictions and row resets
were the same. Row-wise (whole buckets per rank) and table-wise, pooled and sequence, MCH and
the multi-probe hash.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.multiprocess import run_ranks

STEPS, B = 8, 5
FUSED = {"optimizer": "ROWWISE_ADAGRAD", "learning_rate": 0.1}


def _managed(pooled: bool, hash_table: bool) -> Any:
    from lightrec import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        EmbeddingCollection,
        EmbeddingConfig,
        PoolingType,
    )
    from lightrec.modules.managed_collision import (
        HashZchManagedCollisionModule,
        LFU_EvictionPolicy,
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        ManagedCollisionEmbeddingBagCollection,
        ManagedCollisionEmbeddingCollection,
        MCHManagedCollisionModule,
    )

    torch.manual_seed(0)
    if pooled:
        configs: list[Any] = [
            EmbeddingBagConfig(num_embeddings=12, embedding_dim=4, name="t0", feature_names=["f0"]),
            EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t1", feature_names=["f1", "f2"],
                               pooling=PoolingType.MEAN),
        ]  # fmt: skip
        collection: Any = EmbeddingBagCollection(configs)
    else:
        configs = [EmbeddingConfig(num_embeddings=12, embedding_dim=4, name="t0", feature_names=["f0"]),
                   EmbeddingConfig(num_embeddings=10, embedding_dim=4, name="t1", feature_names=["f1", "f2"])]  # fmt: skip
        collection = EmbeddingCollection(configs)
    modules: dict[str, Any] = {
        "t0": MCHManagedCollisionModule(12, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=1000, buckets=2),
        "t1": MCHManagedCollisionModule(10, "cpu", LFU_EvictionPolicy(), 3, input_hash_size=1000, buckets=2),
    }
    if hash_table:
        modules["t1"] = HashZchManagedCollisionModule(10, "cpu", total_num_buckets=2, max_probe=3, input_hash_size=1000)
    cls = ManagedCollisionEmbeddingBagCollection if pooled else ManagedCollisionEmbeddingCollection
    return cls(collection, ManagedCollisionCollection(modules, configs), return_remapped_features=True)


def _batches(world: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(1)
    steps = []
    for s in range(STEPS):
        ranks = []
        for _ in range(world):
            lengths = torch.randint(0, 3, (3 * B,), generator=g)
            values = torch.randint(0, 40 + 25 * s, (int(lengths.sum()),), generator=g) * 13 % 1000
            ranks.append((values, lengths))
        steps.append(ranks)
    return steps


def _kjt(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from lightrec import KeyedJaggedTensor

    values, lengths = [], []
    for k in range(3):
        for ids, lens in parts:
            start = int(lens[: k * B].sum())
            values.append(ids[start : start + int(lens[k * B : (k + 1) * B].sum())])
            lengths.append(lens[k * B : (k + 1) * B])
    return KeyedJaggedTensor(["f0", "f1", "f2"], torch.cat(values), lengths=torch.cat(lengths))


def _flat(out: Any) -> torch.Tensor:
    """Pooled ``[B, sum D]``, or the sequence rows of every feature one after the other."""
    return torch.cat([out[f].values() for f in ("f0", "f1", "f2")]) if isinstance(out, dict) else out.values()


def _rank_rows(kjt_all: Any, rank: int, world: int) -> dict[str, tuple[int, int]]:
    """Value range of ``rank``'s samples for each feature of the global batch."""
    out = {}
    for f in ("f0", "f1", "f2"):
        lengths = kjt_all[f].lengths()
        out[f] = (int(lengths[: rank * B].sum()), int(lengths[: (rank + 1) * B].sum()))
    return out


def _case(rank: int, world: int, pooled: bool, sharding: str, hash_table: bool) -> dict[str, float]:
    from lightrec.distributed import (
        ManagedCollisionEmbeddingBagCollectionSharder,
        ManagedCollisionEmbeddingCollectionSharder,
        ShardingEnv,
        construct_module_sharding_plan,
        gather_full_state_dict,
        row_wise,
        table_wise,
    )
    from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection

    mc = _managed(pooled, hash_table)
    reference = _managed(pooled, hash_table)
    fused_cls = FusedEmbeddingBagCollection if pooled else FusedEmbeddingCollection
    reference._embedding_module = fused_cls.from_module(mc._embedding_module, fused_params=FUSED, kernel_backend="torch") \
        if pooled else _fused_ec(mc._embedding_module)  # fmt: skip
    sharder_cls = ManagedCollisionEmbeddingBagCollectionSharder if pooled else ManagedCollisionEmbeddingCollectionSharder
    sharder = sharder_cls(fused_params=FUSED, kernel_backend="torch")
    per = {"t0": row_wise(), "t1": row_wise()} if sharding == "rw" else {"t0": table_wise(rank=1), "t1": table_wise(rank=0)}
    plan = construct_module_sharding_plan(mc, per, world_size=world, device_type="cpu", sharder=sharder)
    sharded = sharder.shard(mc, plan, ShardingEnv.from_process_group(torch.distributed.group.WORLD), "cpu")
    diff = {"out": 0.0, "ids": 0.0}
    for parts in _batches(world):
        embeddings, remapped = sharded(_kjt([parts[rank]]))
        out = _flat(embeddings.wait())
        weights = torch.linspace(-1, 1, out.numel()).view_as(out)
        (out * weights).sum().div(B).backward()
        kjt_all = _kjt(parts)
        ref_embeddings, ref_remapped = reference(kjt_all)
        spans = _rank_rows(kjt_all, rank, world)
        if pooled:
            ref_out = ref_embeddings.values()[rank * B : (rank + 1) * B]
            all_weights = torch.cat([torch.linspace(-1, 1, out.numel()).view_as(out)] * world)
            (ref_embeddings.values() * all_weights).sum().div(B * world).backward()
        else:
            ref_out = torch.cat([ref_embeddings[f].values()[a:b] for f, (a, b) in spans.items()])
            _backward_sequence(ref_embeddings, spans, rank, world, B, kjt_all)
        diff["out"] = max(diff["out"], float((out.detach() - ref_out.detach()).abs().max()) if out.numel() else 0.0)
        got = remapped.wait()
        want = torch.cat([ref_remapped[f].values()[a:b] for f, (a, b) in spans.items()])
        diff["ids"] = max(diff["ids"], float((got.values() - want).abs().max()) if want.numel() else 0.0)
    full = gather_full_state_dict(sharded.state_dict())
    expected = reference.state_dict()
    diff["weights"] = max(float((full[k].float() - v.float()).abs().max()) for k, v in expected.items() if k.endswith(".weight"))
    diff["id_maps"] = float(sum(not torch.equal(full[k].reshape(-1), v.reshape(-1))
                                for k, v in expected.items() if "_managed_collision" in k))  # fmt: skip
    stats = reference._managed_collision_collection.modules_by_table()["t0"].mc_stats()
    diff["evicted"] = stats["evicted"]
    if pooled and sharding == "rw" and not hash_table:  # serving: the id maps gathered with the tables
        from lightrec.inference import quantize

        served = quantize(sharded, dtype=torch.float16, dst=0)
        if rank == 0:
            probe = _kjt(_batches(world)[-1])
            want = quantize(reference.eval(), dtype=torch.float16)(probe)[0].values()
            diff["served"] = float((served(probe)[0].values() - want).abs().max())
    return diff


def _fused_ec(ec: Any) -> Any:
    from lightrec.kernels import FusedEmbeddingCollection

    fused = FusedEmbeddingCollection(ec.embedding_configs(), fused_params=FUSED, kernel_backend="torch")
    fused.load_state_dict(ec.state_dict())
    return fused


def _backward_sequence(embeddings: Any, spans: dict[str, tuple[int, int]], rank: int, world: int, b: int, kjt: Any) -> None:
    """The reference loss of a sequence model: every rank's rows weighted as that rank weights its own."""
    total = 0
    for r in range(world):
        rows = torch.cat([embeddings[f].values()[a:e] for f, (a, e) in _rank_rows(kjt, r, world).items()])
        total = total + (rows * torch.linspace(-1, 1, rows.numel()).view_as(rows)).sum().div(b * world)
    total.backward()


def _all_cases(rank: int, world: int) -> dict[str, dict[str, float]]:
    return {
        "pooled_rw": _case(rank, world, True, "rw", False),
        "pooled_tw": _case(rank, world, True, "tw", False),
        "sequence_rw": _case(rank, world, False, "rw", False),
        "pooled_rw_hash": _case(rank, world, True, "rw", True),
    }


def test_two_ranks_decide_and_train_as_the_unsharded_module() -> None:
    for rank_result in run_ranks(_all_cases, world_size=2, timeout=600):
        for case, diff in rank_result.items():
            assert diff["evicted"] > 0, case  # the stream made the tables evict
            assert diff["ids"] == 0 and diff["id_maps"] == 0, (case, diff)  # same remapping decisions
            assert diff["out"] < 1e-5 and diff["weights"] < 1e-5, (case, diff)
            assert diff.get("served", 0.0) == 0.0, (case, diff)
