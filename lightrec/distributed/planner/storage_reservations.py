"""torchrec's ``torchrec.distributed.planner.storage_reservations``: memory set aside for everything
that is not an embedding table, before the planner places tables.

``EmbeddingShardingPlanner(storage_reservation=...)`` takes one of these (or lightrec's plain
fraction). Each returns a copy of the topology whose table memory (HBM on ``cuda``, DDR on ``cpu``)
is reduced per rank:

=====================================  ==========================================================
``FixedPercentageStorageReservation``  ``cap * (1 - percentage)``
``HeuristicalStorageReservation``      ``(cap - dense - kjt) * (1 - percentage)``, where ``dense``
                                       is the bytes of every parameter and buffer outside the
                                       shardable collections times ``parameter_multiplier`` (weights,
                                       gradients, optimizer state, DDP buckets; or
                                       ``dense_tensor_estimate`` bytes when given), on every rank,
                                       and ``kjt`` the input batch's ids and lengths (12 bytes per
                                       id, 4 per bag, times 20 for copies in flight; ids and bags
                                       per feature from the constraints' ``batch_sizes``,
                                       ``num_poolings`` and ``pooling_factors``, as the cost
                                       model counts them)
``InferenceStorageReservation``        ``floor(cap * (1 - percentage)) - dense - kjt`` for a
                                       model served without training: ``dense`` is the bytes of
                                       every parameter and buffer outside the shardable
                                       collections, once (or ``dense_tensor_estimate``), and ``kjt``
                                       8 bytes per input id of one batch, counted as above
=====================================  ==========================================================

A rank left with no memory raises ``PlannerError`` naming what took it.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math

import numpy as np
from torch import nn

from lightrec.distributed.planner.plan import ModuleSharder
from lightrec.distributed.planner.tables import ShardableModule, find_shardable_modules, lookups_per_step
from lightrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    StorageReservation,
    Topology,
)

__all__ = [
    "FixedPercentageStorageReservation",
    "HeuristicalStorageReservation",
    "InferenceStorageReservation",
    "reduce_storage_caps",
]

_KJT_COPIES = 20  # input KJT buffers alive at once (pipelined batches, all-to-all send/receive)
_ID_BYTES = 8  # an int64 id of a served batch


def reduce_storage_caps(topology: Topology, caps: np.ndarray, why: str) -> Topology:
    """``topology`` with its table memory set to ``caps`` ``[W]`` (HBM on cuda, DDR on cpu)."""
    if (caps <= 0).any():
        raise PlannerError(
            f"no memory is left for embedding tables on ranks {np.flatnonzero(caps <= 0).tolist()}: {why}; "
            "lower the reservation or give the ranks more memory",
            [], 0.0, float(caps.min()), PlannerErrorType.INSUFFICIENT_STORAGE,
        )  # fmt: skip
    field = "hbm_cap" if topology.compute_device == "cuda" else "ddr_cap"
    return dataclasses.replace(topology, **{field: caps.tolist()})


def _check_percentage(name: str, percentage: float) -> float:
    if not 0.0 <= percentage < 1.0:
        raise ValueError(f"{name}(percentage={percentage!r}) must be in [0, 1)")
    return float(percentage)


class _CapsReservation(StorageReservation):
    """A reservation that lowers every rank's table memory to what :meth:`_caps` leaves of it."""

    def reserve(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints] | None = None,
    ) -> Topology:  # fmt: skip
        caps, why = self._caps(topology, batch_size, module, sharders, constraints or {})
        return reduce_storage_caps(topology, caps, why)

    @abc.abstractmethod
    def _caps(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints],
    ) -> tuple[np.ndarray, str]:  # fmt: skip
        """``([W] table memory left per rank, what took the rest)``."""


class FixedPercentageStorageReservation(_CapsReservation):
    """Keep ``percentage`` of every rank's table memory free."""

    def __init__(self, percentage: float) -> None:
        self._percentage = _check_percentage("FixedPercentageStorageReservation", percentage)

    def _caps(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints],
    ) -> tuple[np.ndarray, str]:  # fmt: skip
        return topology.storage_caps * (1.0 - self._percentage), f"{self._percentage:.0%} reserved"


def _dense_bytes(module: nn.Module, shardable: list[ShardableModule], multiplier: float) -> float:
    """Bytes of the parameters and buffers of ``module`` outside the ``shardable`` collections, times
    ``multiplier`` (buffers too, as lightrec has always counted them)."""
    inside = {id(t) for m in shardable for t in (*m.module.parameters(), *m.module.buffers())}
    tensors = [t for t in (*module.parameters(), *module.buffers()) if id(t) not in inside]
    return multiplier * float(sum(t.numel() * t.element_size() for t in tensors))


class HeuristicalStorageReservation(_CapsReservation):
    """Reserve the dense part of the model, the input batch and a percentage (module docstring).

    Args:
        percentage: fraction of what is left kept free (activations, allocator slack).
        parameter_multiplier: bytes reserved per byte of dense parameters and buffers.
        dense_tensor_estimate: bytes of the dense part to use instead of counting them.
    """

    def __init__(
        self, percentage: float, parameter_multiplier: float = 6.0, dense_tensor_estimate: int | None = None
    ) -> None:
        self._percentage = _check_percentage("HeuristicalStorageReservation", percentage)
        if parameter_multiplier < 0:
            raise ValueError(f"parameter_multiplier must be >= 0, got {parameter_multiplier}")
        self._multiplier = float(parameter_multiplier)
        self._dense_estimate = dense_tensor_estimate
        self.last_reserved_bytes: dict[str, float] = {}

    def _caps(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints],
    ) -> tuple[np.ndarray, str]:  # fmt: skip
        shardable = find_shardable_modules(module, sharders)
        if self._dense_estimate is not None:
            dense = float(self._dense_estimate)
        else:
            dense = _dense_bytes(module, shardable, self._multiplier)
        ids = bags = 0.0
        for m in shardable:
            for name, cfg in m.configs.items():
                c = constraints.get(name, ParameterConstraints())
                # the constraint's batch sizes, poolings and pooling factors, as the cost model counts them
                table_ids, table_bags = lookups_per_step(c, max(1, len(cfg.feature_names)), batch_size, name)
                ids += table_ids
                bags += table_bags
        kjt = _KJT_COPIES * (12.0 * ids + 4.0 * bags)
        self.last_reserved_bytes = {"dense": dense, "kjt": kjt}
        caps = (topology.storage_caps - dense - kjt) * (1.0 - self._percentage)
        why = f"dense part {dense / 2**20:.1f} MiB, input batch {kjt / 2**20:.1f} MiB, then {self._percentage:.0%}"
        return caps, why


class InferenceStorageReservation(_CapsReservation):
    """Reserve a percentage, the dense part of the model and one input batch, for serving.

    torchrec's inference reservation: first ``percentage`` of every rank's table memory is kept free
    (rounded down to whole bytes), then the dense part (every parameter and buffer outside the
    shardable collections, counted once: no gradients or optimizer state; ``dense_tensor_estimate``
    bytes instead when given) and the ids of one batch (8 bytes each; ids per table from the
    constraints' ``batch_sizes``, ``num_poolings`` and ``pooling_factors``, as the cost model counts
    them) are taken from every rank. The dense part is assumed replicated on every rank.

    Args:
        percentage: fraction in ``[0, 1)`` of each rank's table memory kept free.
        dense_tensor_estimate: bytes of the dense part to use instead of counting them.

    After :meth:`reserve`, :attr:`last_reserved_bytes` holds ``{"dense": ..., "kjt": ...}`` and
    :attr:`last_reserved_topology` a copy of the returned topology.
    """

    def __init__(self, percentage: float, dense_tensor_estimate: int | None = None) -> None:
        self._percentage = _check_percentage("InferenceStorageReservation", percentage)
        if dense_tensor_estimate is not None and (
            isinstance(dense_tensor_estimate, bool)
            or not isinstance(dense_tensor_estimate, int | float)
            or not dense_tensor_estimate >= 0
        ):
            raise ValueError(
                f"InferenceStorageReservation(dense_tensor_estimate={dense_tensor_estimate!r}): give the dense "
                "part's bytes (>= 0), or None to count the model's dense parameters and buffers"
            )
        self._dense_estimate = dense_tensor_estimate
        self.last_reserved_bytes: dict[str, float] = {}
        self._last_reserved_topology: Topology | None = None

    @property
    def last_reserved_topology(self) -> Topology | None:
        """A copy of the topology the last :meth:`reserve` returned (None before the first)."""
        return None if self._last_reserved_topology is None else copy.deepcopy(self._last_reserved_topology)

    def reserve(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints] | None = None,
    ) -> Topology:  # fmt: skip
        reserved = super().reserve(topology, batch_size, module, sharders, constraints)
        self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved

    def _caps(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints],
    ) -> tuple[np.ndarray, str]:  # fmt: skip
        shardable = find_shardable_modules(module, sharders)
        given = self._dense_estimate
        dense = float(given) if given is not None else _dense_bytes(module, shardable, 1.0)
        ids = 0.0
        for m in shardable:
            for name, cfg in m.configs.items():
                c = constraints.get(name, ParameterConstraints())
                ids += lookups_per_step(c, max(1, len(cfg.feature_names)), batch_size, name)[0]
        kjt = float(math.ceil(_ID_BYTES * ids))
        self.last_reserved_bytes = {"dense": dense, "kjt": kjt}
        caps = np.floor(topology.storage_caps * (1.0 - self._percentage)) - dense - kjt
        why = f"{self._percentage:.0%} reserved, dense part {dense / 2**20:.1f} MiB, input batch {kjt / 2**20:.1f} MiB"
        return caps, why
