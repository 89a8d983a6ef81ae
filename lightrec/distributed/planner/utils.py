"""torchrec's ``torchrec.distributed.planner.utils``: the small helpers planner parts and
extensions share -- how sharders are keyed, what an option's traffic weighs, unit conversions.

Sharders are keyed by the qualified name of the module type they shard (:func:`sharder_name`):
``{sharder_name(s.module_type): s}`` is the ``sharder_map`` an estimator receives, and
``build_sharder_data_map`` turns it into picklable :class:`~lightrec.distributed.planner.types.SharderData`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from lightrec.distributed.fbgemm_qcomm_codec import CommOp
from lightrec.distributed.planner.constants import NUM_POOLINGS
from lightrec.distributed.planner.plan import ModuleSharder, ShardingType, placement
from lightrec.distributed.planner.sharder_data import SharderData, build_sharder_data, build_sharder_data_map
from lightrec.distributed.planner.types import ParameterConstraints, Perf, ShardingOption, Storage

__all__ = [
    "BinarySearchPredicate",
    "build_sharder_data",
    "build_sharder_data_map",
    "bytes_to_gb",
    "bytes_to_mb",
    "extract_comm_data_type_size",
    "extract_comm_data_type_size_v2",
    "gb_to_bytes",
    "get_num_poolings",
    "is_prefetch_pipelined",
    "is_prefetch_pipelined_v2",
    "mb_to_bytes",
    "placement",
    "prod",
    "reset_shard_rank",
    "sharder_name",
    "storage_repr_in_gb",
]


def sharder_name(t: type) -> str:
    """``"<module>.<class>"`` of ``t``: the key of a sharder in a ``sharder_map``."""
    return f"{t.__module__}.{t.__name__}"


def is_prefetch_pipelined_v2(sharding_option: ShardingOption, sharder_data: SharderData) -> bool:
    """Whether the option's cache prefetches later batches' rows (its ``cache_params``, else the
    sharder's ``fused_params["prefetch_pipeline"]``)."""
    params = sharding_option.cache_params
    if params is not None and params.prefetch_pipeline:
        return True
    return bool(sharder_data.fused_params.get("prefetch_pipeline", False))


def is_prefetch_pipelined(sharding_option: ShardingOption, sharder: ModuleSharder) -> bool:
    """:func:`is_prefetch_pipelined_v2` read from a live sharder."""
    return is_prefetch_pipelined_v2(sharding_option, build_sharder_data(sharder))


def extract_comm_data_type_size_v2(
    sharding_option: ShardingOption, sharder_data: SharderData
) -> tuple[float, float, float, float]:
    """Bytes per element of the option's ``(forward all-to-all, backward all-to-all, forward
    reduce-scatter, backward reduce-scatter)``: the table's element size unless the sharder
    quantizes that collective (pooled options: the pooled all-to-all and reduce-scatter;
    sequence options: the sequence all-to-all)."""
    size = float(sharding_option.tensor.element_size())
    a2a_fwd = a2a_bwd = rs_fwd = rs_bwd = size
    qcomm = sharder_data.qcomm_dtype_sizes
    a2a = CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL if sharding_option.is_pooled else CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL
    if a2a.name in qcomm:
        a2a_fwd, a2a_bwd = qcomm[a2a.name]
    if sharding_option.is_pooled and CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name in qcomm:
        rs_fwd, rs_bwd = qcomm[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name]
    return a2a_fwd, a2a_bwd, rs_fwd, rs_bwd


def extract_comm_data_type_size(
    sharder: ModuleSharder, sharding_option: ShardingOption
) -> tuple[float, float, float, float]:
    """:func:`extract_comm_data_type_size_v2` read from a live sharder."""
    return extract_comm_data_type_size_v2(sharding_option, build_sharder_data(sharder))


def get_num_poolings(constraints: dict[str, ParameterConstraints] | None, so: ShardingOption) -> list[float]:
    """Poolings per sample of each of the option's features: the table's constraint, else 1 each."""
    c = (constraints or {}).get(so.name)
    if c is not None and c.num_poolings:
        return [float(p) for p in c.num_poolings]
    return [NUM_POOLINGS] * len(so.input_lengths)


def bytes_to_gb(num_bytes: float) -> float:
    return float(num_bytes / 1024**3)


def bytes_to_mb(num_bytes: float) -> float:
    return float(num_bytes / 1024**2)


def gb_to_bytes(gb: float) -> int:
    return int(gb * 1024**3)


def mb_to_bytes(mb: float) -> int:
    return int(mb * 1024**2)


def prod(iterable: Iterable[int]) -> int:
    """The product of ``iterable`` (1 when empty)."""
    return math.prod(iterable)


def storage_repr_in_gb(storage: Storage | None) -> str:
    """``"Storage(hbm = 1.5 GB, ddr = 0.0 GB)"`` (``""`` for None)."""
    if storage is None:
        return ""
    return f"Storage(hbm = {round(bytes_to_gb(storage.hbm), 3)} GB, ddr = {round(bytes_to_gb(storage.ddr), 3)} GB)"


def reset_shard_rank(proposal: list[ShardingOption]) -> None:
    """Forget the rank of every shard of ``proposal`` (before partitioning it again)."""
    for option in proposal:
        for shard in option.shards:
            shard.rank = None


def _perf_of(option: ShardingOption) -> float:
    return sum(shard.perf.total for shard in option.shards if isinstance(shard.perf, Perf))


def _find_imbalance_tables(sharding_options: list[ShardingOption], target_imbalance: str = "perf") -> list[ShardingOption]:
    """The options with a shard on every busiest rank (by ``"perf"`` or ``"hbm"``), largest first;
    data-parallel and row-wise options, which are on every rank anyway, are left out."""
    if target_imbalance not in ("perf", "hbm"):
        raise ValueError(f"target_imbalance must be 'perf' or 'hbm', got {target_imbalance!r}")
    load: dict[int, float] = {}
    for option in sharding_options:
        for shard in option.shards:
            if shard.rank is None:
                raise ValueError(f"shard of {option.fqn!r} has no rank: partition the options first")
            value = (shard.perf.total if shard.perf else 0.0) if target_imbalance == "perf" else (
                shard.storage.hbm if shard.storage else 0)
            load[shard.rank] = load.get(shard.rank, 0.0) + value
    if len(load) <= 1:
        return []
    busiest = {rank for rank, value in load.items() if value == max(load.values())}
    skip = (ShardingType.DATA_PARALLEL.value, ShardingType.ROW_WISE.value)
    found = [o for o in sharding_options
             if o.sharding_type not in skip and {s.rank for s in o.shards} >= busiest]  # fmt: skip
    if target_imbalance == "perf":
        return sorted(found, key=_perf_of, reverse=True)
    return sorted(found, key=lambda o: o.shards[0].storage.hbm if o.shards[0].storage else 0, reverse=True)


class BinarySearchPredicate:
    """The largest ``x`` in ``[A, B]`` for which a step predicate ``F(x)`` holds, in few probes::

        search = BinarySearchPredicate(0, 100, tolerance=1)
        x = search.next(True)            # the first probe (its argument is ignored)
        while x is not None:
            x = search.next(F(x))

    Args:
        A, B: inclusive bounds; tolerance: stop once the range left is narrower.
    """

    def __init__(self, A: int, B: int, tolerance: int) -> None:  # noqa: N803 - torchrec's argument names
        self.left, self.right, self.tolerance = A, B, tolerance
        self.first = True

    def next(self, prior_result: bool) -> int | None:
        """The next value to probe given the previous probe's result (None: done)."""
        if self.right - self.left < self.tolerance:
            return None
        mid = self.left + (self.right - self.left) // 2
        if self.first:
            self.first = False
            return mid
        if prior_result:
            self.left = mid + 1
        else:
            self.right = mid - 1
        if self.right - self.left < self.tolerance:
            return None
        return self.left + (self.right - self.left) // 2

