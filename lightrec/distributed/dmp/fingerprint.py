"""Ranks agree before they train: one small all-gather compares the tables, the plan and the world.

Every rank of a ``DistributedModelParallel`` must build the same tables and shard them by the same
plan; a rank that does not (another config file, another plan JSON, another lightrec) would
otherwise block in its first all-to-all until the process-group timeout, or -- when the shapes
happen to fit -- train silently on the wrong rows. :func:`check_ranks_agree` describes what this
rank is about to build::

    {"world":  {"world_size": 2, "device_type": "cpu", "torch": "2.13.0", "lightrec": "0.1.0"},
     "tables": {"model.sparse_arch.ebc": {"t0": {"num_embeddings": 100, "embedding_dim": 8,
                                                 "feature_names": ["f0"], "pooling": "SUM",
                                                 "data_type": "FP32"}, ...}},
     "plan":   ShardingPlan.to_dict()}

and all-gathers its SHA-256 (64 bytes per rank). If any differs, a second all-gather brings every
rank's description and each rank raises the same :class:`RankMismatchError` naming the first rank
that differs from rank 0 and the first entry where it does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from lightrec._version import __version__
from lightrec.distributed.planner.plan import ModuleSharder, ShardingPlan
from lightrec.distributed.planner.plan.sharder import table_configs

__all__ = ["RankMismatchError", "check_ranks_agree", "describe", "first_difference"]


class RankMismatchError(ValueError):
    """Ranks were set up with different tables, plans or software: they cannot train together."""


def _value(x: object) -> object:
    name = getattr(x, "name", None)
    return name if name is not None and hasattr(x, "value") else x  # enums by name


def _tables(module: nn.Module, sharders: list[ModuleSharder]) -> dict[str, object]:
    out: dict[str, object] = {}
    for path, m in module.named_modules():
        sharder = next((s for s in sharders if type(m) is s.module_type), None)
        if sharder is None:
            continue
        out[path] = {
            name: {
                "num_embeddings": cfg.num_embeddings,
                "embedding_dim": cfg.embedding_dim,
                "feature_names": list(cfg.feature_names),
                "pooling": _value(getattr(cfg, "pooling", None)),
                "data_type": _value(cfg.data_type),
            }
            for name, cfg in table_configs(sharder, m).items()
        }
    return out


def describe(
    module: nn.Module, sharders: list[ModuleSharder], plan: ShardingPlan, world_size: int, device_type: str
) -> dict[str, object]:
    """What this rank is about to build (see the module docstring); JSON-serialisable."""
    return {
        "world": {
            "world_size": world_size,
            "device_type": device_type,
            "torch": torch.__version__,
            "lightrec": __version__,
        },
        "tables": _tables(module, sharders),
        "plan": json.loads(plan.to_json(indent=None)),
    }


def first_difference(a: object, b: object, where: str = "") -> tuple[str, object, object] | None:
    """``(path, a's value, b's value)`` of the first entry where two descriptions differ, or None."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in list(a) + [k for k in b if k not in a]:
            here = f"{where}[{key!r}]" if where else str(key)
            if key not in a or key not in b:
                return here, a.get(key, "<missing>"), b.get(key, "<missing>")
            found = first_difference(a[key], b[key], here)
            if found is not None:
                return found
        return None
    return None if a == b else (where, a, b)


def _short(x: object) -> str:
    text = json.dumps(x, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


def check_ranks_agree(description: Mapping[str, object], pg: dist.ProcessGroup | None = None) -> None:
    """Raise :class:`RankMismatchError` on every rank unless every rank of ``pg`` passes the same description.

    A collective (one all-gather of a digest; a second one only when ranks differ). Without an
    initialised process group, or with one rank, there is nothing to compare.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(pg) == 1:
        return
    text = json.dumps(description, sort_keys=True, default=str)
    digests: list[object] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(digests, hashlib.sha256(text.encode()).hexdigest(), group=pg)
    if len(set(digests)) == 1:
        return
    everyone: list[object] = [None] * len(digests)
    dist.all_gather_object(everyone, description, group=pg)
    for rank in range(1, len(everyone)):
        found = first_difference(everyone[0], everyone[rank])
        if found is not None:
            where, theirs, ours = found
            raise RankMismatchError(
                f"ranks disagree before training: rank {rank} differs from rank 0 at {where}: rank 0 has "
                f"{_short(theirs)}, rank {rank} has {_short(ours)}. Every rank must build the same tables with "
                "the same plan and the same software (same config files, plan JSON and installed versions)"
            )
    raise RankMismatchError(
        f"ranks disagree before training: their descriptions hash differently ({digests})"
    )
