"""``SharderData``: what the planner's estimators need of a sharder, as picklable data.

A sharder object may hold process groups, codecs and closures; an estimator only needs three
facts of it, which torchrec snapshots as ``SharderData`` (so estimates can run in another process
and be cached):

* ``fused_params`` -- the sharder's fused-kernel options (the optimizer sizes the state, a
  ``cache_load_factor`` the cache);
* ``qcomm_dtype_sizes`` -- per output collective (torchrec's ``CommOp`` *names*), the bytes per
  element of its forward and backward traffic when the sharder quantizes it: fp16/bf16 2, fp8
  and int8 1 (lightrec's row codecs add a per-row scale, which this size leaves out, as
  torchrec's does);
* ``storage_usage_type`` -- which storage rule applies (an embedding sharder, a quantized one,
  any other ``ModuleSharder``).

``build_sharder_data_map({sharder_name(module type): sharder})`` builds the map an estimator
reads, keyed as the planner keys its sharders (``planner.utils.sharder_name``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightrec.distributed.comm.qcomm import RowCodec
from lightrec.distributed.fbgemm_qcomm_codec import CommOp
from lightrec.distributed.planner.plan import ModuleSharder, StorageUsageType

__all__ = ["SharderData", "SharderDataMap", "build_sharder_data", "build_sharder_data_map"]

_FP32_BYTES = 4.0


@dataclass
class SharderData:
    """Picklable facts of one sharder (see the module docstring)."""

    fused_params: dict[str, Any] = field(default_factory=dict)
    qcomm_dtype_sizes: dict[str, tuple[float, float]] = field(default_factory=dict)
    storage_usage_type: StorageUsageType = StorageUsageType.DEFAULT


SharderDataMap = dict[str, SharderData]


def _codec_bytes(codec: RowCodec | None) -> float:
    if codec is None:
        return _FP32_BYTES
    return {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0}[codec.precision]


def build_sharder_data(sharder: ModuleSharder) -> SharderData:
    """The :class:`SharderData` of ``sharder``."""
    if not isinstance(sharder, ModuleSharder):
        raise TypeError(f"sharder must be a ModuleSharder, got {type(sharder).__name__}")
    sizes: dict[str, tuple[float, float]] = {}
    registry = sharder.qcomm_codecs_registry or {}
    for op in CommOp:  # lightrec keys a registry by the op's value, torchrec by its name
        codecs = registry.get(op.value) or registry.get(op.name)
        if codecs is not None:
            sizes[op.name] = (_codec_bytes(codecs.forward), _codec_bytes(codecs.backward))
    return SharderData(dict(sharder.fused_params or {}), sizes, sharder.storage_usage_type)


def build_sharder_data_map(sharder_map: Mapping[str, ModuleSharder]) -> SharderDataMap:
    """``{key: build_sharder_data(sharder)}`` for every entry of ``sharder_map``."""
    return {key: build_sharder_data(sharder) for key, sharder in sharder_map.items()}
