"""Split a checkpoint dict into what rank 0 writes once and what every rank writes for itself."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.checkpoint.blocks import state_kind
from lightrec.distributed.checkpoint.files import (
    FORMAT,
    RankPayload,
    SavedGroup,
    SavedState,
    agree_outcomes,
    attempt_outcome,
    write_collectively,
)
from lightrec.distributed.checkpoint.index import ParamIndex, local_tables, optimizer_params
from lightrec.kernels.batched_embedding import flush_kernels
from lightrec.kernels.tiered.store import sequential_access, store_of

__all__ = ["save_sharded_checkpoint"]


def _copy(t: torch.Tensor) -> torch.Tensor:
    """What a payload holds for a shard's tensor ``t``.

    A kernel's table weights are views of one flat storage; torch.save of a view writes the whole
    storage, so each shard is copied out on its own. A tiered table's backing store is the one
    exception: each of its tensors is a whole storage (for SSD a memory-mapped file), so it is
    written as it is -- streamed from the store page by page, never materialised in memory.
    """
    if store_of(t) is not None and t.is_contiguous() and t.storage_offset() == 0:
        return t.detach()
    return t.detach().to("cpu", copy=True).contiguous()


def save_sharded_checkpoint(
    path: str | os.PathLike,
    checkpoint: dict[str, Any],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    lr_schedulers: Sequence[object] = (),
    pg: dist.ProcessGroup | None = None,
) -> None:
    """Write ``checkpoint`` as a sharded checkpoint directory (a collective: every rank calls it).

    Args:
        path: the checkpoint directory to create (replaced atomically if it exists).
        checkpoint: ``{"state_dict": module.state_dict(), "optimizer_states": [opt.state_dict()],
            "lr_schedulers": [sched.state_dict()], ...anything else}`` -- Lightning's layout; every
            entry other than those three is saved as is by rank 0.
        module: the model whose ``state_dict()`` is ``checkpoint["state_dict"]`` (a
            ``DistributedModelParallel`` or any module holding sharded collections).
        optimizers: the optimizers of ``checkpoint["optimizer_states"]``, in order.
        lr_schedulers: the schedulers of ``checkpoint["lr_schedulers"]``, in order.
        pg: the process group of the model's ranks (default: the world).

    Raises:
        CheckpointError: on every rank, when any rank failed to write -- or, with several ranks, to
            collect its part (a table that cannot be flushed, an optimizer that steps a parameter of
            another module): the message names each failed rank; ``path`` is unchanged.
        ValueError: on one process, ``checkpoint`` does not match ``optimizers``/``lr_schedulers``.
    """
    rank, world = (dist.get_rank(pg), dist.get_world_size(pg)) if dist.is_initialized() else (0, 1)
    if world == 1:
        header, payload, streamed = _rank_part(checkpoint, module, optimizers, lr_schedulers, rank, world)
    else:
        # Agreed before any file is touched: a rank whose part fails must fail every rank, not leave
        # the others waiting in write_collectively's first collective.
        error, part = attempt_outcome(lambda: _rank_part(checkpoint, module, optimizers, lr_schedulers, rank, world))
        agree_outcomes((error, None), pg)
        assert part is not None
        header, payload, streamed = part
    with sequential_access(streamed):  # SSD stores read ahead while torch.save streams them
        write_collectively(path, header, payload, pg)


def _rank_part(
    checkpoint: dict[str, Any],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    lr_schedulers: Sequence[object],
    rank: int,
    world: int,
) -> tuple[dict[str, Any], RankPayload, list[torch.Tensor]]:
    """This rank's part of the checkpoint: ``(header, payload, streamed)`` -- what rank 0 writes once
    (``header``), what this rank writes (``payload``) and the tensors in it that stream from a
    tiered table's store (``streamed``)."""
    flush_kernels(module)  # a tiered table's dirty cached rows go to its store, which is saved
    tables = local_tables(module)
    index = ParamIndex(module, tables)
    state_dict = dict(checkpoint.get("state_dict", {}))
    payload: RankPayload = {
        "rank": rank,
        "shapes": {k: t.global_shape for k, t in tables.items()},
        "tables": {},
        "optim": [],
        "groups": [],
        "lr_schedulers": list(checkpoint.get("lr_schedulers", [])),  # this rank's (its groups)
        "scheduler_optimizer": [],
    }
    for key, table in tables.items():
        state_dict.pop(key, None)
        if table.replicated and rank != 0:
            continue
        payload["tables"][key] = [(m.shard_offsets, m.shard_sizes, _copy(p)) for m, p in table.shards]

    dense_states: list[dict[str, Any]] = []
    extra_states: list[dict[str, object]] = []
    opt_states = list(checkpoint.get("optimizer_states", []))
    if len(opt_states) != len(optimizers):
        raise ValueError(
            f"checkpoint has {len(opt_states)} optimizer states but {len(optimizers)} optimizers were given; "
            "pass the optimizers in the order of checkpoint['optimizer_states']"
        )
    for i, (opt, sd) in enumerate(zip(optimizers, opt_states, strict=True)):
        what = f"optimizers[{i}] ({type(opt).__name__})"
        params = optimizer_params(opt, sd)
        sharded: dict[str, dict[str, SavedState]] = {}
        dense: dict[str, Any] = {}
        # Entries that name no parameter (a WarmupOptimizer's "__warmup" schedule position, also as a
        # CombinedOptimizer part's "<prefix>.__warmup") are the optimizer's own: saved as they are.
        extra: dict[str, object] = {}
        for key, state in sd["state"].items():
            if key not in params:
                extra[key] = state
                continue
            param = params[key]
            stable = index.stable_id(param, what)
            if id(param) not in index.shard_of:
                dense[stable] = state
                continue
            table = tables[stable]
            if table.replicated and rank != 0:
                continue
            _, meta = index.shard_of[id(param)]
            for name, value in state.items():
                if not isinstance(value, torch.Tensor):
                    value = torch.tensor(value)
                kind = state_kind(value, meta.shard_sizes, f"{what} state {name!r} of {stable}")
                entry = sharded.setdefault(stable, {}).setdefault(name, {"kind": kind, "blocks": []})
                entry["blocks"].append((meta.shard_offsets, meta.shard_sizes, _copy(value)))
        groups: list[SavedGroup] = []
        keys = iter(k for g in sd["param_groups"] for k in g["params"])
        for g in sd["param_groups"]:
            ids = [index.stable_id(params[next(keys)], what) for _ in g["params"]]
            groups.append({"ids": ids, "hparams": {k: v for k, v in g.items() if k != "params"}})
        payload["optim"].append(sharded)
        payload["groups"].append(groups)
        dense_states.append(dense)
        extra_states.append(extra)

    # Per-group scheduler entries (base_lrs, _last_lr, lr_lambdas, ...) travel with their group:
    # another plan groups the tables differently, so lists are rebuilt group by group on load.
    if lr_schedulers and len(lr_schedulers) != len(payload["lr_schedulers"]):
        raise ValueError(
            f"checkpoint has {len(payload['lr_schedulers'])} LR scheduler states but {len(lr_schedulers)} "
            "schedulers were given; pass them in the order of checkpoint['lr_schedulers']"
        )
    by_optimizer = {id(o): i for i, o in enumerate(optimizers)}
    for k, sched_state in enumerate(payload["lr_schedulers"]):
        sched = lr_schedulers[k] if lr_schedulers else None
        i = by_optimizer.get(id(getattr(sched, "optimizer", None)), -1)
        payload["scheduler_optimizer"].append(i)
        if i < 0:
            continue
        groups = payload["groups"][i]
        for name, value in sched_state.items():
            if isinstance(value, list) and len(value) == len(groups):
                for g, v in zip(groups, value, strict=True):
                    g.setdefault("sched", {}).setdefault(k, {})[name] = v

    header = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states", "lr_schedulers")}
    header["state_dict"] = state_dict
    header["lightrec_sharded"] = {
        "format": FORMAT,
        "world_size": world,
        "tables": sorted(tables),
        "dense_optim": dense_states,
        "extra_optim": extra_states,
        "has_training_state": "optimizer_states" in checkpoint,
    }
    streamed = [t for blocks in payload["tables"].values() for *_, t in blocks]
    streamed += [b[2] for opt in payload["optim"] for states in opt.values() for e in states.values() for b in e["blocks"]]
    return header, payload, streamed
