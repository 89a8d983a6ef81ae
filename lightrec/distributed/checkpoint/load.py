"""Read a sharded (or consolidated) checkpoint back as *this* rank's checkpoint dict, for any plan.

The result has Lightning's layout with values shaped for the live model and optimizers:
``state_dict`` holds ``ShardedTableState`` (exactly this rank's blocks) for model-parallel tables
and full tensors for data-parallel ones; ``optimizer_states[i]`` is in the live optimizer's own
naming (its parameter names or indices) with state tensors cut to its shards; LR scheduler lists
that have one entry per parameter group are rebuilt for the live groups. Nothing is applied here:
``module.load_state_dict`` / ``optimizer.load_state_dict`` (or Lightning) do that.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.checkpoint.blocks import Allocator, Block, CheckpointError, assemble
from lightrec.distributed.checkpoint.files import (
    FORMAT,
    RankPayload,
    SavedGroup,
    is_sharded_checkpoint,
    read_meta,
    read_shards,
)
from lightrec.distributed.checkpoint.index import LocalTable, ParamIndex, local_tables, optimizer_params
from lightrec.distributed.checkpoint.safe_load import load_file
from lightrec.distributed.sharding.state_dict import ShardedTableState
from lightrec.kernels.tiered.store import SsdRowStore, scratch_like, store_of

__all__ = ["CheckpointSource", "ForeignCheckpointError", "load_sharded_checkpoint", "open_checkpoint"]


class ForeignCheckpointError(CheckpointError):
    """A readable checkpoint file that lightrec did not write (e.g. a plain Lightning checkpoint)."""


@dataclass
class CheckpointSource:
    """A checkpoint opened for reading (see ``files.py`` for the layout).

    Attributes:
        meta: rank 0's replicated part (``state_dict`` without tables, loop state, ...).
        payloads: every saving rank's part (a consolidated file is one payload of full tables).
        dense_optim: per optimizer, ``{stable id: state}`` of replicated parameters.
        world_size: how many ranks wrote it.
        has_training_state: optimizer/scheduler state was saved.
    """

    meta: dict[str, Any]
    payloads: list[RankPayload]
    dense_optim: list[dict[str, Any]]
    world_size: int
    has_training_state: bool

    def table_blocks(self, key: str) -> list[Block]:
        return [b for p in self.payloads for b in p["tables"].get(key, [])]

    def table_shape(self, key: str) -> list[int] | None:
        return next((p["shapes"][key] for p in self.payloads if key in p["shapes"]), None)

    def saved_tables(self) -> set[str]:
        return {k for p in self.payloads for k in p["shapes"]}

    def state_blocks(self, i: int, key: str) -> dict[str, tuple[str, list[Block]]]:
        """``{state name: (kind, blocks)}`` of table ``key`` in optimizer ``i``, over every rank."""
        out: dict[str, tuple[str, list[Block]]] = {}
        for p in self.payloads:
            if i < len(p["optim"]):
                for name, entry in p["optim"][i].get(key, {}).items():
                    out.setdefault(name, (entry["kind"], []))[1].extend(entry["blocks"])
        return out


def open_checkpoint(path: str | os.PathLike) -> CheckpointSource:
    """Open a sharded checkpoint directory or a file written by ``consolidate_checkpoint``.

    Files are verified against the folder's manifest and unpickled with ``weights_only=True``.

    Raises:
        CheckpointError: a file is missing, truncated, corrupt, from another save, or holds
            objects that are not safe to load (the message names the file).
        FileNotFoundError: nothing at ``path``.
    """
    if is_sharded_checkpoint(path):
        meta = read_meta(path)
        info = meta.pop("lightrec_sharded")
        return CheckpointSource(
            meta, read_shards(info["folder"], info["world_size"]), info["dense_optim"], info["world_size"],
            info["has_training_state"],
        )  # fmt: skip
    if os.path.isdir(path):
        raise CheckpointError(
            f"{os.fspath(path)!r} is a folder but not a lightrec sharded checkpoint (it holds no meta.pt and no "
            "manifest.json); pass the checkpoint folder itself, e.g. lightning_logs/<name>/version_0/checkpoints/"
            "last.ckpt"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {os.fspath(path)!r} does not exist")
    meta = load_file(path, mmap=True)
    info = meta.pop("lightrec_consolidated", None) if isinstance(meta, dict) else None
    if info is None or info.get("format") != FORMAT:
        raise ForeignCheckpointError(
            f"{os.fspath(path)!r} is neither a lightrec sharded checkpoint directory nor a file written by "
            "lightrec.distributed.checkpoint.consolidate_checkpoint"
        )
    return CheckpointSource(meta, [info["payload"]], info["dense_optim"], 1, info["has_training_state"])


def _state_dict(source: CheckpointSource, tables: dict[str, LocalTable], strict: bool) -> dict[str, Any]:
    state_dict = dict(source.meta.get("state_dict", {}))
    unknown = sorted(source.saved_tables() - set(tables))
    if unknown and strict:
        raise CheckpointError(
            f"the checkpoint has tables {unknown} that the model does not shard; load with strict=False "
            "to ignore them"
        )
    for key, table in tables.items():
        shape = source.table_shape(key)
        if shape is None:
            continue  # reported as a missing key by load_state_dict
        if list(shape) != table.global_shape:
            raise CheckpointError(
                f"table {key!r} is {list(shape)} in the checkpoint but {table.global_shape} in the model"
            )
        blocks = source.table_blocks(key)
        local = [
            (m, assemble(blocks, m.shard_offsets, m.shard_sizes, "elem", key, _allocator(p)))
            for m, p in table.shards
        ]
        if table.replicated:
            state_dict[key] = local[0][1]
        else:
            dtype = table.shards[0][1].dtype if table.shards else torch.float32
            state_dict[key] = ShardedTableState(list(shape), local, dtype)
    return state_dict


def _allocator(live: torch.Tensor) -> Allocator | None:
    """Where a reshaped block of ``live`` is assembled: next to its SSD store when ``live`` is a
    tiered table's (file-backed, so a table larger than memory is never materialised), else None
    (``torch.empty``)."""

    def file_backed(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        out = scratch_like(live, shape, dtype)
        return out if out is not None else torch.empty(shape, dtype=dtype)

    return file_backed if isinstance(store_of(live), SsdRowStore) else None


class _GroupMatcher:
    """Finds, for a live param group, the saved group holding any of the same parameters."""

    def __init__(self, source: CheckpointSource, i: int, own: int) -> None:
        order = [own] + [r for r in range(len(source.payloads)) if r != own]
        self._groups = [
            g for r in order for g in (source.payloads[r]["groups"][i] if i < len(source.payloads[r]["groups"]) else [])
        ]
        self._by_id: dict[str, SavedGroup] = {}
        for g in self._groups:
            for stable in g["ids"]:
                self._by_id.setdefault(stable, g)

    def match(self, ids: Sequence[str]) -> SavedGroup | None:
        return next((self._by_id[s] for s in ids if s in self._by_id), None)


def _optimizer_state(
    source: CheckpointSource, i: int, opt: torch.optim.Optimizer, index: ParamIndex, matcher: _GroupMatcher
) -> dict[str, Any]:
    template = opt.state_dict()
    params = optimizer_params(opt, template)
    what = f"optimizers[{i}] ({type(opt).__name__})"
    state: dict[int | str, object] = {}
    dense = source.dense_optim[i] if i < len(source.dense_optim) else {}
    for key, param in params.items():
        stable = index.stable_id(param, what)
        if id(param) not in index.shard_of:
            if stable in dense:
                state[key] = dense[stable]
            continue
        _, meta = index.shard_of[id(param)]
        saved = source.state_blocks(i, stable)
        live_state = opt.state.get(param, {}) if hasattr(opt, "state") else {}
        if saved:
            state[key] = {
                name: assemble(blocks, meta.shard_offsets, meta.shard_sizes, kind, f"{what} state {name!r} of {stable}",
                               _allocator(live_state[name]) if isinstance(live_state.get(name), torch.Tensor) else None)
                for name, (kind, blocks) in saved.items()
            }  # fmt: skip
    groups = []
    keys = iter(k for g in template["param_groups"] for k in g["params"])
    for g in template["param_groups"]:
        own_keys = [next(keys) for _ in g["params"]]
        saved_group = matcher.match([index.stable_id(params[k], what) for k in own_keys])
        hparams = saved_group["hparams"] if saved_group is not None else {k: v for k, v in g.items() if k != "params"}
        groups.append({**hparams, "params": own_keys})
    return {"state": state, "param_groups": groups}


def _scheduler_states(
    source: CheckpointSource,
    own: int,
    optimizers: Sequence[torch.optim.Optimizer],
    index: ParamIndex,
    matchers: list[_GroupMatcher],
) -> list[dict[str, Any]]:
    payload = source.payloads[own]
    out = []
    for k, base in enumerate(payload["lr_schedulers"]):
        base = dict(base)
        i = payload["scheduler_optimizer"][k] if k < len(payload["scheduler_optimizer"]) else -1
        if 0 <= i < len(optimizers):
            per_group_names = {n for g in payload["groups"][i] for n in g.get("sched", {}).get(k, {})}
            live = optimizers[i].param_groups
            for name in per_group_names:
                value = base.get(name)
                rebuilt = []
                for gi, g in enumerate(live):
                    saved = matchers[i].match([index.stable_id(p, f"optimizers[{i}]") for p in g["params"]])
                    per_group = saved.get("sched", {}).get(k, {}) if saved is not None else {}
                    if name in per_group:
                        rebuilt.append(per_group[name])
                    elif isinstance(value, list) and value:
                        rebuilt.append(value[min(gi, len(value) - 1)])
                    else:
                        raise CheckpointError(
                            f"LR scheduler {k}: no saved {name!r} for parameter group {gi} of optimizers[{i}]"
                        )
                base[name] = rebuilt
        out.append(base)
    return out


def load_sharded_checkpoint(
    path: str | os.PathLike | CheckpointSource,
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    strict: bool = True,
    pg: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """This rank's checkpoint dict for the live ``module`` and ``optimizers`` (see the module docstring).

    Not a collective: each rank reads (memory-mapped) only the bytes of the blocks it needs.

    Raises:
        CheckpointError: the checkpoint is incomplete or its tables do not fit the model.
    """
    source = path if isinstance(path, CheckpointSource) else open_checkpoint(path)
    rank = dist.get_rank(pg) if dist.is_initialized() else 0
    own = rank if rank < len(source.payloads) else 0
    tables = local_tables(module)
    index = ParamIndex(module, tables)
    checkpoint = {k: v for k, v in source.meta.items() if k != "state_dict"}
    checkpoint["state_dict"] = _state_dict(source, tables, strict)
    if source.has_training_state:
        matchers = [_GroupMatcher(source, i, own) for i in range(len(optimizers))]
        checkpoint["optimizer_states"] = [
            _optimizer_state(source, i, opt, index, matchers[i]) for i, opt in enumerate(optimizers)
        ]
        checkpoint["lr_schedulers"] = _scheduler_states(source, own, optimizers, index, matchers)
    return checkpoint
