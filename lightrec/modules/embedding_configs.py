"""Table configurations: what an embedding table is, independent of where it lives.

A config names a table, its shape ``[num_embeddings, embedding_dim]``, the features that look
it up, how bags are pooled and how the weights are initialised. Collections, kernels, the planner
and the sharders all read the same config objects, so nothing here depends on any of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import NamedTuple

import torch

from lightrec._enum import ValueEnum

__all__ = [
    "DATA_TYPE_NUM_BITS",
    "BaseEmbeddingConfig",
    "DataType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "PoolingType",
    "QuantConfig",
    "data_type_to_dtype",
    "pooling_type_to_str",
]


@unique
class PoolingType(Enum):
    """How the rows of one bag (one sample's ids of one feature) are reduced.

    ``SUM`` and ``MEAN`` produce one ``[embedding_dim]`` vector per bag; ``NONE`` keeps every
    row (used by ``EmbeddingCollection``, sequence features).
    """

    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@unique
class DataType(ValueEnum):
    """Storage type of embedding weights (training uses FP32; serving may quantize)."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"


_DATA_TYPE_TO_DTYPE: dict[DataType, torch.dtype] = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
    DataType.INT8: torch.uint8,
    DataType.INT4: torch.quint4x2,
    DataType.INT2: torch.quint2x4,
}


#: Bits one stored value of each type takes (a quantized row adds its scale and bias on top).
DATA_TYPE_NUM_BITS: dict[DataType, int] = {
    DataType.FP32: 32,
    DataType.FP16: 16,
    DataType.BF16: 16,
    DataType.INT8: 8,
    DataType.INT4: 4,
    DataType.INT2: 2,
}


def data_type_to_dtype(data_type: DataType) -> torch.dtype:
    """The torch dtype that stores a table of ``data_type`` (quantized types store bytes)."""
    return _DATA_TYPE_TO_DTYPE[data_type]


def pooling_type_to_str(pooling: PoolingType) -> str:
    """``nn.EmbeddingBag`` mode string for a pooling type (``"sum"`` or ``"mean"``)."""
    if pooling == PoolingType.NONE:
        raise ValueError("pooling=PoolingType.NONE has no EmbeddingBag mode; use EmbeddingCollection instead")
    return str(pooling.value).lower()


@dataclass
class BaseEmbeddingConfig:
    """Fields shared by pooled and unpooled tables.

    Args:
        num_embeddings: rows of the table; valid ids are ``[0, num_embeddings)``.
        embedding_dim: width of each row.
        name: unique table name; parameter names are ``embedding_bags.<name>.weight``.
        data_type: storage type of the weights.
        feature_names: features whose ids index this table (several features may share one table).
        weight_init_max / weight_init_min: uniform init range; each one left ``None`` defaults to
            ``±sqrt(1 / num_embeddings)`` like torchrec (whatever the other one is).
        num_embeddings_post_pruning: torchrec's rows after pruning for inference; accepted and
            kept for torchrec compatibility, lightrec prunes nothing (``None``: no pruning).
        init_fn: optional ``fn(weight) -> None`` that initialises the weight in place instead.
        need_pos: kept for torchrec compatibility (positional weights); unused by lightrec kernels.
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    num_embeddings_post_pruning: int | None = None
    init_fn: Callable[[torch.Tensor], torch.Tensor | None] | None = None
    need_pos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_embeddings, int) or self.num_embeddings <= 0:
            raise ValueError(
                f"num_embeddings of table {self.name!r} must be a positive int, got {self.num_embeddings!r}"
            )
        if not isinstance(self.embedding_dim, int) or self.embedding_dim <= 0:
            raise ValueError(
                f"embedding_dim of table {self.name!r} must be a positive int, got {self.embedding_dim!r}"
            )
        if isinstance(self.feature_names, str):
            raise TypeError(
                f"feature_names of table {self.name!r} must be a list of strings, got the string "
                f"{self.feature_names!r}; write feature_names=[{self.feature_names!r}]"
            )
        self.feature_names = list(self.feature_names)
        if len(set(self.feature_names)) != len(self.feature_names):
            raise ValueError(f"feature_names of table {self.name!r} has duplicates: {self.feature_names}")
        post_pruning = self.num_embeddings_post_pruning
        bad_post_pruning = isinstance(post_pruning, bool) or not isinstance(post_pruning, int) or post_pruning <= 0
        if post_pruning is not None and bad_post_pruning:
            raise ValueError(
                f"num_embeddings_post_pruning of table {self.name!r} must be a positive int or None, got "
                f"{post_pruning!r}; leave it None for no pruning"
            )
        if self.weight_init_max is None:
            self.weight_init_max = math.sqrt(1.0 / self.num_embeddings)
        if self.weight_init_min is None:
            self.weight_init_min = -math.sqrt(1.0 / self.num_embeddings)
        if self.weight_init_min > self.weight_init_max:
            raise ValueError(
                f"weight_init_min ({self.weight_init_min}) of table {self.name!r} is above "
                f"weight_init_max ({self.weight_init_max})"
            )

    def get_weight_init_max(self) -> float:
        return float(self.weight_init_max)  # type: ignore[arg-type]  # set in __post_init__

    def get_weight_init_min(self) -> float:
        return float(self.weight_init_min)  # type: ignore[arg-type]  # set in __post_init__

    def num_features(self) -> int:
        """How many features read this table (a method, as in torchrec)."""
        return len(self.feature_names)

    def init_weight(self, weight: torch.Tensor) -> None:
        """Initialise ``weight`` (``[rows, embedding_dim]``, possibly one shard) in place."""
        if weight.device.type == "meta":
            return
        with torch.no_grad():
            if self.init_fn is not None:
                self.init_fn(weight)
            else:
                weight.uniform_(self.get_weight_init_min(), self.get_weight_init_max())


@dataclass
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """A pooled table, served by ``EmbeddingBagCollection``: one vector per (feature, sample)."""

    pooling: PoolingType = PoolingType.SUM

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling == PoolingType.NONE:
            raise ValueError(
                f"EmbeddingBagConfig {self.name!r} has pooling=PoolingType.NONE; use EmbeddingConfig "
                "and EmbeddingCollection for unpooled (sequence) lookups"
            )


@dataclass
class EmbeddingConfig(BaseEmbeddingConfig):
    """An unpooled table, served by ``EmbeddingCollection``: one vector per id."""

    pooling: PoolingType = PoolingType.NONE


class QuantConfig(NamedTuple):
    """torchrec-compatible quantization config for embedding collections.

    Args:
        activation: observer factory for the lookup output; lightrec always returns float32
            (the dense layers after it are not quantized), so only ``torch.float`` is accepted.
        weight: observer factory whose ``dtype`` is the table storage type: ``torch.int8``
            (or ``torch.quint8``), ``torch.quint4x2`` (int4) or ``torch.float16``.
        per_table_weight_dtype: ``{table name: dtype}`` overriding ``weight``'s dtype for some
            tables (torchrec's field; ``from_float`` reads it as ``per_table``).

    Lives here because torchrec users import it from ``torchrec.modules.embedding_configs``;
    :mod:`lightrec.modules.quant_config` turns it into a ``DataType``. Example (the TorchRec
    tutorial's)::

        qconfig = QuantConfig(
            activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
            weight=quant.PlaceholderObserver.with_args(dtype=torch.int8),
        )
    """

    activation: Callable[[], object]  # observer factory (``Observer.with_args(dtype=...)``)
    weight: Callable[[], object]  # observer factory; its observer's ``dtype`` is the storage type
    per_table_weight_dtype: dict[str, torch.dtype | str | DataType] | None = None
