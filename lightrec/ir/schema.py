"""The JSON layout of each serialized module (``torchrec.ir.schema``): plain dataclasses of JSON
types, one per module family.

Enums are stored by value (``"FP32"``, ``"SUM"``), devices as strings, pairs as two-element
lists. Weights are not part of the metadata: they travel as the exported program's parameters.
:func:`from_dict` reads a dataclass back and names the field that is missing, unknown or of the
wrong kind.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from lightrec.ir.types import IRMetadataError

__all__ = [
    "EBCMetadata",
    "ECMetadata",
    "EmbeddingBagConfigMetadata",
    "EmbeddingConfigMetadata",
    "FPEBCMetadata",
    "PositionWeightedModuleCollectionMetadata",
    "PositionWeightedModuleMetadata",
    "from_dict",
]


@dataclass
class EmbeddingConfigMetadata:
    """An ``EmbeddingConfig`` without its ``init_fn`` (code does not serialize; the weights do)."""

    num_embeddings: int
    embedding_dim: int
    name: str
    data_type: str
    feature_names: list[str]
    weight_init_max: float | None
    weight_init_min: float | None
    need_pos: bool
    num_embeddings_post_pruning: int | None = None  # absent from metadata written before it existed


@dataclass
class EmbeddingBagConfigMetadata(EmbeddingConfigMetadata):
    """An ``EmbeddingBagConfig``: a table config plus its pooling (``"SUM"`` or ``"MEAN"``)."""

    # a default only because the base class has one; from_dict still requires it (a lost pooling
    # must not silently become SUM)
    pooling: str = field(default="SUM", metadata={"required": True})


@dataclass
class EBCMetadata:
    """An ``EmbeddingBagCollection``."""

    tables: list[EmbeddingBagConfigMetadata]
    is_weighted: bool
    device: str | None
    bounds_check: str = "error"


@dataclass
class ECMetadata:
    """An ``EmbeddingCollection``."""

    tables: list[EmbeddingConfigMetadata]
    need_indices: bool
    device: str | None
    bounds_check: str = "error"


@dataclass
class PositionWeightedModuleMetadata:
    """A ``PositionWeightedModule``: its positions and the weights' dtype (``"float32"`` …)."""

    max_feature_length: int
    dtype: str = "float32"


@dataclass
class PositionWeightedModuleCollectionMetadata:
    """A ``PositionWeightedModuleCollection``: ``[feature, max_length]`` pairs, in order."""

    max_feature_lengths: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class FPEBCMetadata:
    """A ``FeatureProcessedEmbeddingBagCollection``: one processor collection, or one processor per
    feature (``features`` in order); the processors and the collection are its children."""

    is_fp_collection: bool
    features: list[str]


_D = TypeVar("_D")


def from_dict(cls: type[_D], raw: object, where: str) -> _D:
    """``cls(**raw)`` with a clear error for what JSON can get wrong.

    Args:
        cls: a dataclass of this module.
        raw: the decoded JSON object.
        where: what is being read (for the message), e.g. ``"EmbeddingBagCollection metadata"``.

    Raises:
        IRMetadataError: ``raw`` is not an object, lacks a required field, has an unknown one, or
            holds a value of another JSON type than its field's (e.g. ``"is_weighted": "no"``).
    """
    if not isinstance(raw, Mapping):
        raise IRMetadataError(f"{where} must be a JSON object, got {type(raw).__name__}: {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    required = [
        name for name, f in fields.items()
        if f.metadata.get("required") or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    ]  # fmt: skip
    missing = [name for name in required if name not in raw]
    if unknown or missing:
        raise IRMetadataError(
            f"{where} does not match {cls.__name__}: missing fields {missing}, unknown fields {unknown}; "
            f"the fields are {list(fields)} (was the program written by another lightrec version?)"
        )
    hints = typing.get_type_hints(cls)
    for name, value in raw.items():
        if not _conforms(value, hints[name]):
            raise IRMetadataError(
                f"{where}: field {name!r} must be {_describe(hints[name])}, got {type(value).__name__}: {value!r} "
                "(was the metadata edited, or written by another lightrec version?)"
            )
    values: dict[str, Any] = dict(raw)
    return cls(**values)


def _conforms(value: object, hint: object) -> bool:
    """Whether the decoded JSON ``value`` fits the field type ``hint`` (nested dataclasses: any object)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is tuple:  # JSON has no tuples: a list of the same length
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(args)
            and all(_conforms(v, a) for v, a in zip(value, args, strict=True))
        )
    if dataclasses.is_dataclass(hint):
        return isinstance(value, Mapping)  # read by its own from_dict
    return True


def _describe(hint: object) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return "an object" if dataclasses.is_dataclass(hint) else hint.__name__
    return str(hint).replace("lightrec.ir.schema.", "")
