"""Sharding plan types and their JSON form: where every shard of every embedding table lives.

A plan is pure data (no collectives, no tensors), so it can be printed, saved as JSON, edited by
hand and fed back to ``DistributedModelParallel``::

    ShardingPlan.plan                      {module path: EmbeddingModuleShardingPlan}
      EmbeddingModuleShardingPlan          {table name:  ParameterSharding}
        ParameterSharding                  sharding_type, compute_kernel, ranks, sharding_spec,
                                           cache_params, key_value_params (tiered kernels)
          sharding_spec: list[ShardMetadata]
            ShardMetadata                  shard_offsets [row, col], shard_sizes [rows, cols],
                                           placement "rank:<r>/<device>"

Tiered kernels (tables larger than the fast tier, docs/tiered-tables.md): ``fused_uvm_caching``
keeps every row in host memory with a cache in the device's memory, ``key_value`` every row on
SSD; :class:`CacheParams` (cache size and algorithm) and :class:`KeyValueParams` (the SSD
directory) say how, with torchrec's names.

Shard layout rules (shared by the hand-written helpers, the planner and the sharders):

* row-wise over ``n`` ranks: ``block = ceil(rows / n)``; shard ``i`` holds rows
  ``[i * block, min((i + 1) * block, rows))`` -- the last shards may be short or empty
  (see :func:`row_wise_shard_sizes`);
* column-wise over ``n`` shards: columns are dealt in units of 4 when ``cols % 4 == 0`` and there
  are at least ``n`` such units, else in units of 1; the first ``units % n`` shards get one unit
  more (see :func:`column_wise_shard_sizes`).

The file is pure data: it imports no collective and nothing of lightrec's but its sibling
``cache_params.py`` (the tiered kernels' parameters) and the enum base, so the sharders, the
checkpoints and the planner all read plans from here (through the package,
``lightrec.distributed.planner.plan``; ``lightrec.distributed.types`` re-exports it under torchrec's
path).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any

from lightrec._enum import ValueEnum
from lightrec.distributed.planner.plan.cache_params import CacheParams, KeyValueParams

__all__ = [
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "ParameterSharding",
    "ShardMetadata",
    "ShardingPlan",
    "ShardingType",
    "TIERED_KERNELS",
    "UNIMPLEMENTED_SHARDING_TYPES",
    "column_wise_shard_sizes",
    "enum_value",
    "placement_for",
    "row_wise_shard_sizes",
]

_PLAN_JSON_VERSION = 1


@unique
class ShardingType(str, ValueEnum):
    """How one table is split across ranks (values are the strings stored in plans)."""

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    #: torchrec's grid sharding (column blocks, each row-wise over one host). lightrec names it so
    #: plans written for torchrec parse, but neither its planner nor its sharders build it: a
    #: plan that uses it is refused with the alternatives (``UNIMPLEMENTED_SHARDING_TYPES``).
    GRID_SHARD = "grid_shard"


@unique
class EmbeddingComputeKernel(str, ValueEnum):
    """Which lookup kernel serves a shard: plain autograd (``dense``), optimizer fused into the
    backward pass (``fused``), quantized inference (``quant``), fused over a cache of hot rows
    whose table lives in host memory (``fused_uvm_caching``) or on SSD (``key_value``), or an
    extension's own (``customized_kernel``)."""

    DENSE = "dense"
    FUSED = "fused"
    QUANT = "quant"
    FUSED_UVM_CACHING = "fused_uvm_caching"
    KEY_VALUE = "key_value"
    #: An extension's own kernel (torchrec's name): lightrec's collections refuse it; a
    #: ``GroupedPooledEmbeddingsLookup`` subclass builds it in ``_create_embedding_kernel``.
    CUSTOMIZED_KERNEL = "customized_kernel"


#: Sharding types lightrec parses in plans but does not build (its sharders and planner refuse them).
UNIMPLEMENTED_SHARDING_TYPES = (ShardingType.GRID_SHARD.value,)

#: The compute kernels whose rows live in a backing tier behind a cache.
TIERED_KERNELS = (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.KEY_VALUE.value)


_ENUM_VALUES: dict[type[Enum], frozenset[str]] = {}


def enum_value(value: object, enum_cls: type[Enum], arg: str) -> str:
    """Normalise an enum member or its string value to the string; reject anything else."""
    if isinstance(value, enum_cls):
        return str(value.value)
    allowed = _ENUM_VALUES.setdefault(enum_cls, frozenset(m.value for m in enum_cls))
    if isinstance(value, str) and value in allowed:
        return str.__str__(value)  # plain str even for another library's str-Enum member
    raise ValueError(
        f"{arg} must be one of {sorted(allowed)} (or {enum_cls.__name__} members), got {value!r}"
    )


_PLACEMENT_RE = re.compile(r"^rank:(\d+)/(.+)$")


def placement_for(rank: int, device_type: str, local_size: int) -> str:
    """Placement string of a shard on ``rank``: ``"rank:3/cpu"`` or ``"rank:3/cuda:1"``.

    CUDA ranks use the local device ``rank % local_size`` (one GPU per local rank).
    """
    if device_type == "cuda":
        return f"rank:{rank}/cuda:{rank % local_size}"
    return f"rank:{rank}/{device_type}"


def row_wise_shard_sizes(rows: int, num_shards: int) -> list[int]:
    """Rows of each row-wise shard: blocks of ``ceil(rows / num_shards)``, last ones short/empty.

    >>> row_wise_shard_sizes(10, 4)
    [3, 3, 3, 1]
    >>> row_wise_shard_sizes(5, 4)
    [2, 2, 1, 0]
    """
    if num_shards <= 0:
        raise ValueError(f"num_shards must be positive, got {num_shards}")
    block = math.ceil(rows / num_shards)
    return [max(0, min(block, rows - i * block)) for i in range(num_shards)]


def column_wise_shard_sizes(cols: int, num_shards: int) -> list[int]:
    """Columns of each column-wise shard (4-aligned when possible, sizes differ by one unit).

    >>> column_wise_shard_sizes(64, 3)
    [24, 20, 20]
    >>> column_wise_shard_sizes(10, 3)
    [4, 3, 3]
    """
    if num_shards <= 0 or num_shards > cols:
        raise ValueError(
            f"cannot split {cols} columns into {num_shards} column-wise shards: use between 1 and "
            f"{cols} shards (ranks)"
        )
    unit = 4 if cols % 4 == 0 and cols // 4 >= num_shards else 1
    q, r = divmod(cols // unit, num_shards)
    return [(q + (1 if i < r else 0)) * unit for i in range(num_shards)]


@dataclass
class ShardMetadata:
    """One shard: a ``[rows, cols]`` block at ``[row, col]`` offsets of the full table.

    Args:
        shard_offsets: ``[first row, first column]`` of the shard in the full table.
        shard_sizes: ``[rows, cols]`` of the shard (rows may be 0 for trailing row-wise shards).
        placement: ``"rank:<global rank>/<device>"``, e.g. ``"rank:0/cpu"``, ``"rank:1/cuda:1"``.
    """

    shard_offsets: list[int]
    shard_sizes: list[int]
    placement: str

    def __post_init__(self) -> None:
        for arg in ("shard_offsets", "shard_sizes"):
            value = list(getattr(self, arg))
            if len(value) != 2 or not all(isinstance(v, int) and v >= 0 for v in value):
                raise ValueError(
                    f"ShardMetadata.{arg} must be two non-negative ints [row, col], got {value!r}"
                )
            setattr(self, arg, value)
        if not isinstance(self.placement, str) or not _PLACEMENT_RE.match(self.placement):
            raise ValueError(
                f"ShardMetadata.placement must look like 'rank:0/cpu' or 'rank:1/cuda:1', got {self.placement!r}"
            )

    def _placement_parts(self) -> tuple[str, str]:
        match = _PLACEMENT_RE.match(self.placement)
        if match is None:  # placement was checked at construction; only a later assignment gets here
            raise ValueError(f"ShardMetadata.placement must look like 'rank:0/cpu', got {self.placement!r}")
        return match.group(1), match.group(2)

    @property
    def rank(self) -> int:
        """Global rank that owns the shard."""
        return int(self._placement_parts()[0])

    @property
    def device(self) -> str:
        """Device string of the shard on its rank (``"cpu"``, ``"cuda:1"``)."""
        return self._placement_parts()[1]


class EnumerableShardingSpec(list[ShardMetadata]):
    """The shards of one table, listed: torchrec's spelling of a sharding spec.

    torchrec stores ``ParameterSharding.sharding_spec`` as ``EnumerableShardingSpec(shards=[...])``
    and reads ``spec.shards``; lightrec's plans iterate the spec as a list of ``ShardMetadata``. This
    class is both -- a ``list`` whose ``shards`` attribute is the list itself -- so plan code written
    either way works, and a plan's JSON form does not change.

    Args:
        shards: the table's :class:`ShardMetadata`, one per shard, in shard order.
    """

    def __init__(self, shards: Iterable[ShardMetadata] = ()) -> None:
        super().__init__(shards)

    @property
    def shards(self) -> list[ShardMetadata]:
        """The shards (this object itself, as torchrec's attribute)."""
        return self

    def __repr__(self) -> str:
        return f"EnumerableShardingSpec(shards={list(self)!r})"

    def __reduce__(self) -> tuple[type[EnumerableShardingSpec], tuple[list[ShardMetadata]]]:
        # Pickled as a call with a plain list: torch's weights_only unpickler refuses to extend a
        # list subclass item by item, so a checkpoint holding a plan would not load safely.
        return (type(self), (list(self),))


@dataclass
class ParameterSharding:
    """How one table is sharded.

    Args:
        sharding_type: a :class:`ShardingType` value (stored as its string).
        compute_kernel: an :class:`EmbeddingComputeKernel` value (stored as its string).
        ranks: ranks holding a shard, in shard order (all ranks for data parallel).
        sharding_spec: one :class:`ShardMetadata` per shard, in the same order as ``ranks``;
            ``None`` for data parallel (every rank holds the whole table).
        cache_params: the cache of a tiered kernel (``fused_uvm_caching`` / ``key_value``).
        key_value_params: the SSD directory of a ``key_value`` table.
    """

    sharding_type: str
    compute_kernel: str
    ranks: list[int] | None = None
    sharding_spec: list[ShardMetadata] | None = None
    cache_params: CacheParams | None = None
    key_value_params: KeyValueParams | None = None

    def __post_init__(self) -> None:
        self.sharding_type = enum_value(self.sharding_type, ShardingType, "sharding_type")
        self.compute_kernel = enum_value(self.compute_kernel, EmbeddingComputeKernel, "compute_kernel")
        tiered = self.compute_kernel in TIERED_KERNELS
        if self.cache_params is not None and not tiered:
            raise ValueError(
                f"cache_params is for the tiered compute kernels {list(TIERED_KERNELS)}, got compute_kernel="
                f"{self.compute_kernel!r}; drop cache_params or choose one of them"
            )
        if self.key_value_params is not None and self.compute_kernel != EmbeddingComputeKernel.KEY_VALUE.value:
            raise ValueError(
                f"key_value_params is for compute_kernel='key_value', got {self.compute_kernel!r}; drop it or use key_value"
            )
        if tiered and self.sharding_type == ShardingType.DATA_PARALLEL.value:
            raise ValueError(
                f"compute_kernel={self.compute_kernel!r} cannot be data parallel (every rank would hold a full "
                "replica of a table that does not fit); shard it table-wise, row-wise or column-wise"
            )
        if self.ranks is not None:
            self.ranks = [int(r) for r in self.ranks]
        if self.sharding_spec is not None:
            self.sharding_spec = EnumerableShardingSpec(self.sharding_spec)
            if self.ranks is not None and [s.rank for s in self.sharding_spec] != self.ranks:
                raise ValueError(
                    f"ranks {self.ranks} disagree with the ranks of sharding_spec placements "
                    f"{[s.placement for s in self.sharding_spec]}; list one rank per shard, in order"
                )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sharding_type": self.sharding_type,
            "compute_kernel": self.compute_kernel,
            "ranks": self.ranks,
            "sharding_spec": None
            if self.sharding_spec is None
            else [
                {"shard_offsets": s.shard_offsets, "shard_sizes": s.shard_sizes, "placement": s.placement}
                for s in self.sharding_spec
            ],
        }
        if self.cache_params is not None:
            out["cache_params"] = self.cache_params.to_dict()
        if self.key_value_params is not None:
            out["key_value_params"] = self.key_value_params.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParameterSharding:
        spec = data.get("sharding_spec")
        cache, kv = data.get("cache_params"), data.get("key_value_params")
        return cls(
            sharding_type=data["sharding_type"],
            compute_kernel=data["compute_kernel"],
            ranks=data.get("ranks"),
            sharding_spec=None if spec is None else [ShardMetadata(**s) for s in spec],
            cache_params=None if cache is None else CacheParams.from_dict(cache),
            key_value_params=None if kv is None else KeyValueParams.from_dict(kv),
        )


def _format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """``a | b`` rows under a dashed rule as wide as each column (the TorchRec tutorial's layout)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = [" | ".join(header), " | ".join("-" * w for w in widths)]
    lines += [" | ".join(r) for r in rows]
    return lines


class EmbeddingModuleShardingPlan(dict[str, ParameterSharding]):
    """Shardings of one collection's tables: ``{table name: ParameterSharding}``."""

    def __reduce__(self) -> tuple[type[EmbeddingModuleShardingPlan], tuple[dict[str, ParameterSharding]]]:
        # Pickled as a call with a plain dict (weights_only refuses item-by-item fills of a dict subclass).
        return (type(self), (dict(self),))

    def __str__(self) -> str:
        params = [[n, p.sharding_type, p.compute_kernel, str(p.ranks)] for n, p in self.items()]
        shards = [
            [n, str(s.shard_offsets), str(s.shard_sizes), s.placement]
            for n, p in self.items()
            for s in p.sharding_spec or []
        ]
        lines = _format_table(["param", "sharding type", "compute kernel", "ranks"], params)
        lines += _format_table(["param", "shard offsets", "shard sizes", "placement"], shards)
        return "\n".join(lines)


@dataclass
class ShardingPlan:
    """The plan of a whole model: ``{module path: EmbeddingModuleShardingPlan}``.

    ``""`` is the path of the root module (a bare ``EmbeddingBagCollection``). ``str(plan)``
    prints the TorchRec tutorial's table; :meth:`to_json`/:meth:`save` write a file that
    :meth:`from_json`/:meth:`load` read back into an equal plan.
    """

    plan: dict[str, EmbeddingModuleShardingPlan] = field(default_factory=dict)

    def get_plan_for_module(self, module_path: str) -> EmbeddingModuleShardingPlan | None:
        """The plan of the module at ``module_path`` (as in ``named_modules()``), or ``None``."""
        return self.plan.get(module_path)

    def __str__(self) -> str:
        blocks = [
            (f"module: {path}" if path else "module:") + "\n" + str(module_plan)
            for path, module_plan in self.plan.items()
        ]
        return "\n\n".join(blocks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": _PLAN_JSON_VERSION,
            "plan": {path: {name: ps.to_dict() for name, ps in mp.items()} for path, mp in self.plan.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPlan:
        if not isinstance(data, dict) or "plan" not in data:
            raise ValueError(f"a sharding plan JSON object needs a 'plan' key, got keys {list(data)[:5]!r}")
        version = data.get("version", _PLAN_JSON_VERSION)
        if version != _PLAN_JSON_VERSION:
            raise ValueError(
                f"sharding plan JSON version {version!r} is not supported (expected {_PLAN_JSON_VERSION})"
            )
        if not isinstance(data["plan"], dict):
            raise ValueError(
                f"a sharding plan JSON's 'plan' must map module paths to {{table: sharding}} objects, got "
                f"{type(data['plan']).__name__}"
            )
        plan: dict[str, EmbeddingModuleShardingPlan] = {}
        for path, tables in data["plan"].items():
            if not isinstance(tables, dict):
                raise ValueError(
                    f"a sharding plan JSON's module {path!r} must map table names to sharding objects, got "
                    f"{type(tables).__name__}"
                )
            shardings = {}
            for name, ps in tables.items():
                try:
                    shardings[name] = ParameterSharding.from_dict(ps)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    # A hand-edited plan: say which table is wrong (a bare KeyError 'compute_kernel' did not).
                    detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
                    raise ValueError(
                        f"sharding plan JSON: table {name!r} of module {path!r} is not a valid ParameterSharding "
                        f"({detail}); it needs 'sharding_type', 'compute_kernel', 'ranks' and 'sharding_spec' "
                        "(a list of {'shard_offsets', 'shard_sizes', 'placement'}, or null for data_parallel)"
                    ) from exc
            plan[path] = EmbeddingModuleShardingPlan(shardings)
        return cls(plan)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> ShardingPlan:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON atomically (a reader never sees a half-written file)."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".json.tmp", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ShardingPlan:
        with open(path) as f:
            return cls.from_json(f.read())
