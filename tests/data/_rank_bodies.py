"""Rank bodies for run_ranks, in a module that imports no Lightning (spawned ranks start faster)."""

from __future__ import annotations

from lightrec.data import SyntheticCriteoDataset, rank_dataloader, resolve_rank


def read_synthetic(rank: int, world_size: int) -> dict:
    ds = SyntheticCriteoDataset(batch_size=8, num_batches=7, num_embeddings_cap=500)
    resolved = resolve_rank()  # what the DataModules use when no trainer is attached
    loader = rank_dataloader(ds, *resolved)
    return {
        "indices": list(loader.sampler),
        "ids": [int(b.sparse_features.values()[0]) for b in loader],
        "rank": resolved,
    }
