"""torchrec's ``torchrec.distributed.fbgemm_qcomm_codec``: quantized communication of the embedding
output dists, configured once and handed to the sharders.

::

    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16,
                                                      backward_precision=CommType.BF16))
    sharder = EmbeddingBagCollectionSharder(fused_params=..., qcomm_codecs_registry=registry)

The forward precision applies to the embeddings sent back to the sample owners (pooled all-to-all
of table-/column-wise tables, reduce-scatter of row-wise ones, sequence all-to-all of
``EmbeddingCollection`` s), the backward precision to their gradients. fp16/bf16 send half the
bytes of fp32, fp8 and int8 a quarter plus a few bytes per row (each row scaled on its own). Rows
a rank keeps for itself never go through the codec, and reduce-scatter sums decoded rows in
float32 (torchrec reduces in the low precision). Codecs are lightrec's
(:mod:`lightrec.distributed.comm.qcomm`), not fbgemm's kernels, so they run on CPU and GPU alike;
``fp8_quantize_dim`` is accepted, lightrec scales per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, unique

import torch

from lightrec._enum import ValueEnum
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs, RowCodec, row_codec

__all__ = [
    "CommOp",
    "CommType",
    "QCommsConfig",
    "QuantizedCommCodecs",
    "RowCodec",
    "get_qcomm_codecs",
    "get_qcomm_codecs_registry",
]


@unique
class CommType(ValueEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


@unique
class CommOp(Enum):
    """The collectives a codec registry names (the keys are these values)."""

    POOLED_EMBEDDINGS_ALL_TO_ALL = "pooled_embeddings_all_to_all"
    POOLED_EMBEDDINGS_REDUCE_SCATTER = "pooled_embeddings_reduce_scatter"
    SEQUENCE_EMBEDDINGS_ALL_TO_ALL = "sequence_embeddings_all_to_all"


@dataclass
class QCommsConfig:
    """Precisions of the forward and backward output dists.

    Args:
        forward_precision, backward_precision: ``CommType`` (or its string value).
        forward_loss_scale, backward_loss_scale: factors applied before an fp16/bf16 cast and undone
            after it (keeps small gradients from flushing to zero).
        fp8_quantize_dim, fp8_quantize_dim_bwd: accepted for torchrec's signature (lightrec scales per row).
        fp8_bwd_uses_143: the backward fp8 format is e4m3 (True) or e5m2 (False, more range).
    """

    forward_precision: CommType = CommType.FP32
    backward_precision: CommType = CommType.FP32
    forward_loss_scale: float | None = None
    backward_loss_scale: float | None = None
    fp8_quantize_dim: int | None = None
    fp8_quantize_dim_bwd: int | None = None
    fp8_bwd_uses_143: bool = False

    def __post_init__(self) -> None:
        for name in ("forward_precision", "backward_precision"):
            value = getattr(self, name)
            try:
                setattr(self, name, CommType(value.value if isinstance(value, Enum) else value))
            except ValueError:
                raise ValueError(
                    f"QCommsConfig.{name}={value!r} is not one of {[t.value for t in CommType]}"
                ) from None
        for name in ("forward_loss_scale", "backward_loss_scale"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"QCommsConfig.{name} must be > 0 or None, got {value!r}")


def get_qcomm_codecs(qcomms_config: QCommsConfig | None) -> QuantizedCommCodecs:
    """The forward and backward codecs of ``qcomms_config`` (no codec for fp32)."""
    if qcomms_config is None:
        return QuantizedCommCodecs()
    return QuantizedCommCodecs(
        forward=row_codec(qcomms_config.forward_precision.value, qcomms_config.forward_loss_scale, "e4m3"),
        backward=row_codec(
            qcomms_config.backward_precision.value,
            qcomms_config.backward_loss_scale,
            "e4m3" if qcomms_config.fp8_bwd_uses_143 else "e5m2",
        ),
    )


def get_qcomm_codecs_registry(
    qcomms_config: QCommsConfig,
    comm_ops: list[CommOp] | None = None,
    device: torch.device | None = None,
) -> dict[str, QuantizedCommCodecs] | None:
    """``{comm op: QuantizedCommCodecs}`` for the sharders' ``qcomm_codecs_registry``.

    Args:
        qcomms_config: the precisions (all fp32: None, nothing to encode).
        comm_ops: the collectives to encode (default: all three of :class:`CommOp`).
        device: accepted for torchrec's signature (the codecs run on any device).
    """
    if qcomms_config.forward_precision == CommType.FP32 and qcomms_config.backward_precision == CommType.FP32:
        return None
    codecs = get_qcomm_codecs(qcomms_config)
    return {op.value: codecs for op in (comm_ops or list(CommOp))}
