"""A small model with a table of every kind, sharded over 2 gloo ranks, and its deterministic batches.

=========  ======================================  ==========================================
collection tables (rows x dim)                     placement on 2 ranks
=========  ======================================  ==========================================
ebc        tw 23x8, rw 29x8, cw 17x8 (4+4 cols),   table_wise(1), row_wise, column_wise([0, 1]),
           twrw 19x8, twcw 13x8, dp 11x8,          table_row_wise, table_column_wise,
           kv 120x8 (SSD), uvm 90x8 (host),          data_parallel, row_wise key_value,
           dense 15x8 (dense kernel)               table_wise(0) fused_uvm_caching, row_wise dense
ec         s_rw 25x4, s_cw 14x4                     row_wise, column_wise([1, 0])
mc         m_rw 12x4 (MCH), m_tw 10x4 (MCH)        row_wise (2 buckets), table_wise(1)
=========  ======================================  ==========================================

Every rank can build every rank's batch of any step (``batch(step, rank)``), so each knows which
rows all the ranks looked up. The managed tables see a drifting vocabulary, so they evict.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

EBC = {"tw": 23, "rw": 29, "cw": 17, "twrw": 19, "twcw": 13, "dp": 11, "kv": 120, "uvm": 90, "dense": 15}
EC = {"s_rw": 25, "s_cw": 14}
MC = {"m_rw": 12, "m_tw": 10}
FUSED = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1, "eps": 1e-6}
B = 4  # samples per rank


class Net(nn.Module):
    """``forward(f_ebc, f_ec, f_mc) -> [B]``: every collection's output through a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
        from lightrec.modules.managed_collision import (
            LRU_EvictionPolicy,
            ManagedCollisionCollection,
            ManagedCollisionEmbeddingBagCollection,
            MCHManagedCollisionModule,
        )

        self.ebc = EmbeddingBagCollection(
            [EmbeddingBagConfig(name=t, num_embeddings=r, embedding_dim=8, feature_names=[f"f_{t}"]) for t, r in EBC.items()],
            device="meta",
        )  # fmt: skip
        self.ec = EmbeddingCollection(
            [EmbeddingConfig(name=t, num_embeddings=r, embedding_dim=4, feature_names=[f"f_{t}"]) for t, r in EC.items()],
            device="meta",
        )  # fmt: skip
        configs = [EmbeddingBagConfig(name=t, num_embeddings=r, embedding_dim=4, feature_names=[f"f_{t}"])
                   for t, r in MC.items()]  # fmt: skip
        modules: dict[str, Any] = {
            t: MCHManagedCollisionModule(r, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=1000, buckets=2)
            for t, r in MC.items()
        }
        self.mc = ManagedCollisionEmbeddingBagCollection(
            EmbeddingBagCollection(configs), ManagedCollisionCollection(modules, configs)
        )
        self.over = nn.Linear(8 * len(EBC) + 4 * len(MC), 1)

    def forward(self, f_ebc: Any, f_ec: Any, f_mc: Any) -> torch.Tensor:
        from lightrec.distributed import Awaitable

        def done(x: Any) -> Any:
            return x.wait() if isinstance(x, Awaitable) else x

        pooled = done(self.ebc(f_ebc)).values()
        managed = done(self.mc(f_mc)[0]).values()
        sequence = done(self.ec(f_ec))
        seq = sum((jt.values().square().sum() for jt in sequence.values()), torch.zeros(()))
        return self.over(torch.cat([pooled, managed], dim=1)).squeeze(1) + 0.01 * seq


def plan(model: Net, world_size: int) -> Any:
    from lightrec.distributed import (
        ManagedCollisionEmbeddingBagCollectionSharder,
        ShardingPlan,
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_column_wise,
        table_row_wise,
        table_wise,
    )

    ebc = construct_module_sharding_plan(model.ebc, {
        "tw": table_wise(rank=1), "rw": row_wise(), "cw": column_wise(ranks=[0, 1]), "twrw": table_row_wise(host_index=0),
        "twcw": table_column_wise(host_index=0), "dp": data_parallel(), "kv": row_wise(compute_kernel="key_value"),
        "uvm": table_wise(rank=0, compute_kernel="fused_uvm_caching"), "dense": row_wise(compute_kernel="dense"),
    }, world_size=world_size)  # fmt: skip
    ec = construct_module_sharding_plan(model.ec, {"s_rw": row_wise(), "s_cw": column_wise(ranks=[1, 0])},
                                        world_size=world_size)  # fmt: skip
    mc = construct_module_sharding_plan(model.mc, {"m_rw": row_wise(), "m_tw": table_wise(rank=1)},
                                        world_size=world_size,
                                        sharder=ManagedCollisionEmbeddingBagCollectionSharder(fused_params=FUSED))  # fmt: skip
    return ShardingPlan({"ebc": ebc, "ec": ec, "mc": mc})


def sharded(tmp: str, world_size: int, fused: dict[str, Any] | None = None) -> Any:
    """The model on this rank, sharded by :func:`plan` (tiered tables under ``tmp``), in a DMP."""
    from lightrec.distributed import DistributedModelParallel, get_default_sharders

    params = {**(fused or FUSED), "cache_load_factor": 0.2, "cache_min_rows": 18, "ssd_storage_directory": tmp}
    torch.manual_seed(0)
    model = Net()
    return DistributedModelParallel(model, plan=plan(model, world_size),
                                    sharders=get_default_sharders(params, kernel_backend="torch"), seed=3)  # fmt: skip


def batch(step: int, rank: int) -> tuple[Any, Any, Any]:
    """``(f_ebc, f_ec, f_mc)`` of ``rank`` at ``step`` (empty bags included; MC ids drift with the step)."""
    from lightrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(7919 * step + rank)

    def kjt(rows: dict[str, int], drift: int = 0) -> Any:
        lengths = torch.randint(0, 3, (len(rows), B), generator=g)
        values = [torch.randint(0, r, (int(lengths[i].sum()),), generator=g) for i, r in enumerate(rows.values())]
        if drift:
            values = [(torch.randint(0, 20 + drift, (v.numel(),), generator=g) * 13) % 1000 for v in values]
        return KeyedJaggedTensor([f"f_{t}" for t in rows], torch.cat(values), lengths=lengths.reshape(-1))

    return kjt(EBC), kjt(EC), kjt(MC, drift=1 + 9 * step)


def touched(step: int, world_size: int) -> dict[str, torch.Tensor]:
    """``{table: sorted unique ids}`` every rank's batch of ``step`` looked up (EBC and EC tables)."""
    out: dict[str, list[torch.Tensor]] = {}
    for rank in range(world_size):
        f_ebc, f_ec, _ = batch(step, rank)
        for kjt in (f_ebc, f_ec):
            for key, jt in kjt.to_dict().items():
                out.setdefault(key[2:], []).append(jt.values())
    return {t: torch.unique(torch.cat(v)) for t, v in out.items()}


def train_step(model: Any, step: int, rank: int) -> None:
    """One step: forward, backward (fused tables update in it), SGD on the dense part."""
    model(*batch(step, rank)).square().mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad
                p.grad = None
