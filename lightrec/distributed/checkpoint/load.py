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
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.checkpoint.blocks import Allocator, Block, CheckpointError, assemble, state_kind
from lightrec.distributed.checkpoint.files import (
    FORMAT,
    RankPayload,
    SavedGroup,
    is_sharded_checkpoint,
    read_meta,
    read_shards,
)
from lightrec.distributed.checkpoint.index import (
    LocalTable,
    ParamIndex,
    local_tables,
    optimizer_params,
    root_module,
)
from lightrec.distributed.checkpoint.safe_load import load_file
from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.planner.plan import ShardMetadata
from lightrec.distributed.sharding.state_dict import ShardedTableState
from lightrec.kernels.tiered.store import SsdRowStore, scratch_like, store_of
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper

__all__ = ["CheckpointSource", "ForeignCheckpointError", "load_sharded_checkpoint", "open_checkpoint"]

# A checkpoint dict as Lightning and torch hand it around (``state_dict``, ``optimizer_states``, ...).
_Checkpoint: TypeAlias = dict[str, Any]


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
        path: where it was read from (for error messages).
        extra_optim: per optimizer, its ``state`` entries that name no parameter (a
            ``WarmupOptimizer``'s schedule position ``"__warmup"``), in the optimizer's own naming.
    """

    meta: dict[str, Any]
    payloads: list[RankPayload]
    dense_optim: list[dict[str, Any]]
    world_size: int
    has_training_state: bool
    path: str | None = None
    extra_optim: list[dict[str, object]] = field(default_factory=list)

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
            info["has_training_state"], os.fspath(path), info.get("extra_optim", []),
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
    return CheckpointSource(
        meta, [info["payload"]], info["dense_optim"], 1, info["has_training_state"], os.fspath(path),
        info.get("extra_optim", []),
    )  # fmt: skip


def _where(source: CheckpointSource) -> str:
    return f"checkpoint {source.path!r}" if source.path is not None else "the checkpoint"


def _check_state_dict(
    source: CheckpointSource, live: Mapping[str, object], tables: dict[str, LocalTable], strict: bool
) -> None:
    """Raise ``CheckpointError`` if the checkpoint's keys or dense shapes do not fit the live model
    (``live``: its ``state_dict(keep_vars=True)``).

    Only the live model's structure and the (replicated) checkpoint metadata are read, so every rank
    reaches the same verdict. torch's ``load_state_dict`` copies every key that fits before it
    reports the others; checking first is what keeps a failed load from changing the model.
    """
    dense = source.meta.get("state_dict", {})
    saved_keys = set(dense) | source.saved_tables()
    where = _where(source)
    problems = []
    if strict:
        missing = sorted(set(live) - saved_keys)
        unexpected = sorted(saved_keys - set(live))
        if missing:
            problems.append(f"the model has keys {missing} that the checkpoint lacks")
        if unexpected:
            problems.append(f"the checkpoint has keys {unexpected} that the model does not have")
    mismatched = [
        f"{key!r} is {list(value.shape)} in the checkpoint but {list(current.shape)} in the model"
        for key, value in sorted(dense.items())
        if key not in tables
        and isinstance(value, torch.Tensor)
        and isinstance(current := live.get(key), torch.Tensor)
        and value.shape != current.shape
    ]
    mismatched += [
        f"table {key!r} is {list(shape)} in the checkpoint but {table.global_shape} in the model"
        for key, table in sorted(tables.items())
        if (shape := source.table_shape(key)) is not None and list(shape) != table.global_shape
    ]
    if mismatched:
        problems.append("shapes differ: " + "; ".join(mismatched))
    if problems:
        fix = (
            "build the model as it was when the checkpoint was saved"
            + (" or load with strict=False to skip missing and unexpected keys" if strict else "")
        )
        raise CheckpointError(f"{where} does not fit the model: {'; '.join(problems)}; nothing was loaded; {fix}")


def _unsharded_tables(
    source: CheckpointSource, live: Mapping[str, object], tables: dict[str, LocalTable]
) -> dict[str, LocalTable]:
    """The saved tables that the live model holds whole, as one-shard ``LocalTable`` s.

    A sharded checkpoint stores every table (and every managed-collision per-row buffer, as a
    ``[rows, 1]`` table) in blocks, apart from the dense ``state_dict``. A live model without
    sharded collections -- the unsharded model, on one process -- has these keys as plain tensors:
    each becomes a "data-parallel" table whose one block is the whole tensor, so the blocks are
    checked and assembled as for any plan (resharding to the unsharded layout). A 1-D buffer is
    shown as ``[rows, 1]``, the shape it was saved in.

    Returns:
        ``{key: LocalTable}`` for saved tables not in ``tables`` whose key the live model holds.
    """
    out: dict[str, LocalTable] = {}
    for key in sorted(source.saved_tables() - set(tables)):
        value = live.get(key)
        if not isinstance(value, torch.Tensor) or value.dim() not in (1, 2):
            continue  # not in the model: strict reports it as unexpected
        whole = value if value.dim() == 2 else value.detach().view(-1, 1)  # a 2-D parameter stays itself (optimizer state follows it)
        shape = list(whole.shape)
        out[key] = LocalTable(key, shape, True, [(ShardMetadata([0, 0], shape, f"rank:0/{value.device}"), whole)])
    return out


def _check_managed_collisions(source: CheckpointSource, module: nn.Module, state_dict: Mapping[str, object]) -> None:
    """Raise ``CheckpointError`` if a managed-collision module of the live model would refuse its
    entries of ``state_dict`` (this rank's checkpoint state dict): other bucket segments than it has
    (e.g. saved with ``buckets=6``, built with 3), ids outside their bucket's rows, a corrupt map.

    Such a module only finds out in ``load_state_dict``, after the embedding tables in front of it
    were copied; asked here (``ManagedCollisionModule.check_state_dict``) the load fails first.
    A sharded module is handed its own rows: the one block of each per-row table this rank holds.
    """
    for path, m in root_module(module).named_modules():
        if not isinstance(m, ManagedCollisionModule):
            continue
        prefix = f"{path}." if path else ""
        entries: dict[str, object] = {}
        for key, value in state_dict.items():
            if not key.startswith(prefix):
                continue
            if isinstance(value, ShardedTableState):
                if len(value.shards) != 1:
                    continue  # no rows here (no module either) or not one block: nothing to check
                value = value.shards[0][1]
            entries[key] = value
        try:
            m.check_state_dict(entries, prefix)
        except ValueError as e:
            raise CheckpointError(
                f"{_where(source)} does not fit the model: {e}; nothing was loaded; build the managed-collision "
                "module with the zch_size and buckets the checkpoint was saved with"
            ) from e


def _state_dict(source: CheckpointSource, tables: dict[str, LocalTable]) -> _Checkpoint:
    state_dict = dict(source.meta.get("state_dict", {}))
    for key, table in tables.items():
        shape = source.table_shape(key)
        if shape is None:
            continue  # strict=False: left as it is
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


_KIND_WORDS = {"elem": "per element", "row": "per row", "scalar": "a scalar"}


def _live_kind(value: object, sizes: Sequence[int]) -> str | None:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return state_kind(value, sizes, "")
    except CheckpointError:
        return None


_OPTIMIZER_FIX = (
    "nothing was loaded; resume with the optimizer (and optimizer settings) the checkpoint was saved "
    "with, or load the weights only"
)
# Hyper-parameters torch added to many optimizers over its versions: a checkpoint of an older torch
# lacks them, which says nothing about the optimizer's type.
_VERSION_FLAGS = frozenset({"foreach", "maximize", "capturable", "differentiable", "fused", "decoupled_weight_decay"})


def _torch_optimizer_of(opt: torch.optim.Optimizer, param: torch.Tensor) -> torch.optim.Optimizer | None:
    """The torch optimizer (``Adam``, ``SGD``...) whose ``step`` updates ``param`` in ``opt``; None
    where the update is lightrec's own (a fused table optimizer, a bare ``KeyedOptimizer``) or
    ``param`` is not found."""
    if isinstance(opt, CombinedOptimizer):
        for _, child in opt.optimizers:
            if any(p is param for p in child.params.values()):
                return _torch_optimizer_of(child, param)
        return None
    if isinstance(opt, (KeyedOptimizerWrapper, OptimizerWrapper)):
        return _torch_optimizer_of(opt._optimizer, param)  # the wrapped optimizer that steps
    if isinstance(opt, KeyedOptimizer):
        return None
    return opt


def _fresh_state_names(
    inner: torch.optim.Optimizer, param: torch.Tensor, hparams: Mapping[str, object], cache: dict[str, set[str] | None]
) -> set[str] | None:
    """The state names ``inner`` creates for ``param`` at its first step with ``hparams``, found by
    stepping a twin (``type(inner)`` on a 2-element zero parameter, zero gradient); None when the
    twin cannot be built or stepped (a closure, sparse gradients, a custom constructor...).

    torch optimizers create their state lazily: a live optimizer that has not stepped shows no
    state to compare the checkpoint's with, so this is what it would have.
    """
    kwargs: dict[str, Any] = {k: v for k, v in hparams.items() if k in inner.defaults}
    key = f"{type(inner).__qualname__} {sorted(kwargs.items(), key=lambda kv: kv[0])!r} {param.dtype}"
    if key not in cache:
        dtype = param.dtype if param.is_floating_point() else torch.float32
        twin_param = torch.zeros(2, dtype=dtype, requires_grad=True)
        twin_param.grad = torch.zeros_like(twin_param)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                twin = type(inner)([twin_param], **kwargs)
                twin.step()
            cache[key] = set(twin.state.get(twin_param, {}))
        except Exception:  # noqa: BLE001 -- any optimizer may refuse the twin: then nothing is compared
            cache[key] = None
    return cache[key]


def _check_group(
    where: str, what: str, index: int, opt: torch.optim.Optimizer, param: torch.Tensor | None, saved: Mapping[str, object]
) -> None:
    """Raise ``CheckpointError`` if the saved hyper-parameters ``saved`` of live param group ``index``
    (holding ``param``) lack one that its torch optimizer has (``Adam``'s ``betas`` in an ``SGD``
    group): the checkpoint was saved with another optimizer type, whether or not there is state yet."""
    inner = _torch_optimizer_of(opt, param) if param is not None else None
    if inner is None:
        return
    lacking = sorted(k for k in inner.defaults if k not in saved and k not in _VERSION_FLAGS)
    if lacking:
        raise CheckpointError(
            f"{where}: param group {index} of {what} is stepped by {type(inner).__name__}, whose hyper-parameters "
            f"{lacking} the checkpoint's group lacks (it has {sorted(saved)}): the checkpoint was saved with "
            f"another optimizer; {_OPTIMIZER_FIX}"
        )


def _check_optimizer_entry(
    where: str, what: str, stable: str, opt: torch.optim.Optimizer, live: object, saved: _Checkpoint,
    sizes: Sequence[int] | None, fresh: set[str] | None = None,
) -> None:
    """Raise ``CheckpointError`` if the saved state of one parameter cannot be loaded into ``live``.

    ``saved`` is ``{state name: (kind, blocks)}`` for a sharded table (``sizes`` its local shard's
    size) or ``{state name: value}`` for a dense parameter (``sizes`` None). ``fresh``: the state
    names the live optimizer creates at its first step (``_fresh_state_names``; None if unknown),
    compared when it has no state yet.
    """
    fix = _OPTIMIZER_FIX
    if not isinstance(live, Mapping) or not live:
        # No state yet (torch creates it at the first step): the saved state is adopted, so it must
        # be what this optimizer would create -- Adam's exp_avg is no state of SGD's.
        if fresh is not None and saved and set(saved) != fresh:
            raise CheckpointError(
                f"{where}: {what} has no state for {stable!r} yet and creates {sorted(fresh)} at its first step, "
                f"but the checkpoint holds {sorted(saved)} (saved with another optimizer or other settings?); {fix}"
            )
        return
    missing = sorted(n for n in live if n not in saved)
    if missing and (saved or isinstance(opt, KeyedOptimizer)):  # a keyed optimizer needs every entry
        raise CheckpointError(
            f"{where}: {what} has state {sorted(live)} for {stable!r}, the checkpoint "
            f"{sorted(saved) if saved else 'none'} (saved with another optimizer?); {fix}"
        )
    for name in sorted(n for n in saved if n in live):
        current = live[name]
        if not isinstance(current, torch.Tensor):
            continue
        if sizes is not None:
            kind = saved[name][0]
            live_kind = _live_kind(current, sizes)
            if live_kind is not None and live_kind != kind:
                raise CheckpointError(
                    f"{where}: {what} state {name!r} of {stable!r} is {_KIND_WORDS.get(kind, kind)} in the "
                    f"checkpoint but {_KIND_WORDS[live_kind]} here ({list(current.shape)} for a shard of "
                    f"{list(sizes)}): the table was saved with another optimizer type (e.g. adagrad vs "
                    f"row_wise_adagrad); {fix}"
                )
        elif isinstance(saved[name], torch.Tensor) and saved[name].shape != current.shape:
            raise CheckpointError(
                f"{where}: {what} state {name!r} of {stable!r} is {list(saved[name].shape)} in the checkpoint "
                f"but {list(current.shape)} here; {fix}"
            )


def _optimizer_state(
    source: CheckpointSource, i: int, opt: torch.optim.Optimizer, index: ParamIndex, matcher: _GroupMatcher
) -> _Checkpoint:
    template = opt.state_dict()
    params = optimizer_params(opt, template)
    what = f"optimizers[{i}] ({type(opt).__name__})"
    where = _where(source)
    # Each live group takes the hyper-parameters of the saved group holding its parameters (its own
    # when none does); they decide which state its optimizer creates.
    groups = []
    hparams_of: dict[int | str, Mapping[str, object]] = {}
    keys = iter(k for g in template["param_groups"] for k in g["params"])
    for gi, g in enumerate(template["param_groups"]):
        own_keys = [next(keys) for _ in g["params"]]
        saved_group = matcher.match([index.stable_id(params[k], what) for k in own_keys])
        if saved_group is not None:
            _check_group(where, what, gi, opt, params[own_keys[0]] if own_keys else None, saved_group["hparams"])
        hparams = saved_group["hparams"] if saved_group is not None else {k: v for k, v in g.items() if k != "params"}
        groups.append({**hparams, "params": own_keys})
        hparams_of.update(dict.fromkeys(own_keys, hparams))
    state: dict[int | str, object] = {}
    dense = source.dense_optim[i] if i < len(source.dense_optim) else {}
    live_states = opt.state if hasattr(opt, "state") else {}
    probes: dict[str, set[str] | None] = {}
    for key, param in params.items():
        stable = index.stable_id(param, what)
        live_state = live_states.get(param, {})
        inner = _torch_optimizer_of(opt, param) if not live_state else None
        fresh = _fresh_state_names(inner, param, hparams_of.get(key, {}), probes) if inner is not None else None
        if id(param) not in index.shard_of:
            saved_dense = dense.get(stable, {})
            _check_optimizer_entry(where, what, stable, opt, live_state, saved_dense, None, fresh)
            if stable in dense:
                state[key] = dense[stable]
            continue
        _, meta = index.shard_of[id(param)]
        saved = source.state_blocks(i, stable)
        _check_optimizer_entry(where, what, stable, opt, live_state, saved, meta.shard_sizes, fresh)
        if saved:
            assembled = {
                name: assemble(blocks, meta.shard_offsets, meta.shard_sizes, kind, f"{what} state {name!r} of {stable}",
                               _allocator(live_state[name]) if isinstance(live_state.get(name), torch.Tensor) else None)
                for name, (kind, blocks) in saved.items()
            }  # fmt: skip
            for name, value in assembled.items():
                current = live_state.get(name)
                if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor) and value.shape != current.shape:
                    raise CheckpointError(
                        f"{where}: {what} state {name!r} of {stable!r} is {list(value.shape)} when cut to this "
                        f"rank's shard but {list(current.shape)} here; nothing was loaded; resume with the "
                        "optimizer the checkpoint was saved with"
                    )
            state[key] = assembled
    extra = source.extra_optim[i] if i < len(source.extra_optim) else {}
    if extra and isinstance(opt, KeyedOptimizer):
        unknown = sorted(str(name) for name in extra if name not in opt._extra_state_names())
        if unknown:
            raise CheckpointError(
                f"{where}: {what} was saved with optimizer state {unknown} that names no parameter (e.g. a "
                f"WarmupOptimizer's schedule position), which this optimizer does not keep ("
                f"{sorted(opt._extra_state_names()) or 'none'}); {_OPTIMIZER_FIX}"
            )
    state.update(extra)  # a torch optimizer keeps entries it does not know as they are
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
) -> _Checkpoint:
    """This rank's checkpoint dict for the live ``module`` and ``optimizers`` (see the module docstring).

    With a process group of more than one rank this is a collective (every rank of ``pg`` calls it,
    as Lightning does): the ranks agree on the outcome, so a checkpoint that does not fit fails on
    every rank alike. Each rank reads (memory-mapped) only the bytes of the blocks it needs.

    Everything is checked before the dict is returned, so applying it cannot fail half-way: with
    ``strict``, every key of the live ``module.state_dict()`` must be in the checkpoint and the
    checkpoint may hold no other; dense tensors and tables must have the live shapes; each live
    optimizer's state must have the saved state names, kinds (per element / per row / scalar) and
    shapes.

    Raises:
        CheckpointError: the checkpoint is incomplete or does not fit the model or the optimizers
            (on every rank when any rank found a problem; the message names the rank, the key, the
            checkpoint and the fix).
    """
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(pg) if distributed else 0
    world = dist.get_world_size(pg) if distributed else 1
    if world == 1:
        return _load(path if isinstance(path, CheckpointSource) else open_checkpoint(path), module, optimizers, strict, rank)
    error: BaseException | None = None
    checkpoint: _Checkpoint = {}
    try:
        # Opened inside the agreement: a rank that cannot read the files (another mount, a file
        # missing on its host) must fail every rank, not leave them waiting in the all_gather below.
        source = path if isinstance(path, CheckpointSource) else open_checkpoint(path)
        checkpoint = _load(source, module, optimizers, strict, rank)
    except Exception as e:  # noqa: BLE001 -- every rank raises it, below
        error = e
    outcomes: list[str | None] = [None] * world
    with collective_guard("all_gather of a checkpoint load's outcome (a rank died while loading?)", pg):
        dist.all_gather_object(outcomes, None if error is None else f"{type(error).__name__}: {error}", group=pg)
    failed = [(r, e) for r, e in enumerate(outcomes) if e is not None]
    if failed:
        if len(failed) == world and isinstance(error, CheckpointError | OSError) and len(set(e for _, e in failed)) == 1:
            raise error  # every rank found the same problem (a misfit, no such file): report it once
        raise CheckpointError("; ".join(f"rank {r}: {e}" for r, e in failed)) from error
    return checkpoint


def _load(
    source: CheckpointSource,
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    strict: bool,
    rank: int,
) -> _Checkpoint:
    own = rank if rank < len(source.payloads) else 0
    live = module.state_dict(keep_vars=True)
    tables = local_tables(module)
    whole = _unsharded_tables(source, live, tables)
    tables.update(whole)
    _check_state_dict(source, live, tables, strict)
    index = ParamIndex(module, tables)
    checkpoint = {k: v for k, v in source.meta.items() if k != "state_dict"}
    if source.has_training_state:
        matchers = [_GroupMatcher(source, i, own) for i in range(len(optimizers))]
        checkpoint["optimizer_states"] = [
            _optimizer_state(source, i, opt, index, matchers[i]) for i, opt in enumerate(optimizers)
        ]
        checkpoint["lr_schedulers"] = _scheduler_states(source, own, optimizers, index, matchers)
    state_dict = _state_dict(source, tables)
    for key in whole:
        value, target = state_dict.get(key), live[key]
        if isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor):
            state_dict[key] = value.view(target.shape)  # a 1-D buffer was assembled as [rows, 1]
    _check_managed_collisions(source, module, state_dict)
    checkpoint["state_dict"] = state_dict
    return checkpoint
