"""The feature spec of a Parquet source: which columns are the label, the dense and the sparse features.

Given by the user (``label``, ``dense``, ``sparse``) and checked against the Arrow schema of the
files, or taken from it (``sparse="auto"``: every integer and list-of-integer column that is not the
label or a dense column; ``dense="auto"``: every floating-point column that is not the label).

Column types a feature reads:

=============  ============================================================================
label          any integer, floating-point or bool column (bools read as 0./1.)
dense          any integer or floating-point column; nulls and NaN become ``dense_fill``
sparse ids     ``int8`` ... ``int64`` / ``uint8`` ... ``uint64`` scalars (one id per row, a
               null is an empty bag with ``nulls="empty"``), or ``list`` / ``large_list`` of
               them (multi-hot: any number of ids per row, empty lists are empty bags)
sparse weights a ``list<float>`` column parallel to a list id column (same length per row)
=============  ============================================================================

Each sparse feature becomes one key of the batch's ``KeyedJaggedTensor`` (in the order given) and
one table of :meth:`FeatureSpec.table_configs` (``t_<feature>``). How its ids meet its table is its
``id_mapping`` (see :mod:`lightrec.data.parquet.sizing` for how table sizes are chosen):

* ``"none"`` (default): the ids are row indices, ``0 <= id < num_embeddings``; ``num_embeddings`` is
  declared, or taken from the files' column statistics (largest id + 1);
* ``"modulo"``: raw non-negative ids, ``id % num_embeddings`` (``num_embeddings`` declared);
* ``"hash"``: raw ids of any int64 value, a 64-bit mix then ``% num_embeddings``;
* ``"managed"``: raw non-negative 64-bit ids handed to the model unchanged, for tables behind
  managed collisions (``RecModule(managed_collisions=...)``, ``num_embeddings`` rows).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

import pyarrow as pa
from typing_extensions import Unpack

from lightrec.data.parquet.errors import ParquetSchemaError
from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

__all__ = [
    "ColumnKind",
    "FeatureOptions",
    "FeatureSpec",
    "IdMapping",
    "NullIds",
    "SparseFeature",
    "build_spec",
    "check_schema",
    "column_kind",
    "column_kind_of",
]

IdMapping = Literal["none", "modulo", "hash", "managed"]
NullIds = Literal["error", "empty"]
ColumnKind = Literal["scalar", "list"]
_ID_MAPPINGS = ("none", "modulo", "hash", "managed")
_SPARSE_OPTIONS = ("column", "weights", "num_embeddings", "id_mapping", "pooling", "nulls")


@dataclass(frozen=True)
class SparseFeature:
    """One sparse feature: a key of the KJT and one embedding table.

    Args:
        name: the feature (KJT key); its table is ``t_<name>``.
        column: the id column (scalar integer or list of integers).
        weights: a ``list<float>`` column parallel to ``column``: one weight per id (a weighted
            feature; the KJT then carries weights, 1.0 for the ids of unweighted features).
        num_embeddings: table rows; required for ``"modulo"``, ``"hash"`` and ``"managed"``.
        id_mapping: ``"none"``, ``"modulo"``, ``"hash"`` or ``"managed"`` (module docstring).
        pooling: ``"SUM"`` or ``"MEAN"`` pooling of the table.
        nulls: a null id (or null list) is an error (``"error"``) or an empty bag (``"empty"``).
    """

    name: str
    column: str
    weights: str | None = None
    num_embeddings: int | None = None
    id_mapping: IdMapping = "none"
    pooling: Literal["SUM", "MEAN"] = "SUM"
    nulls: NullIds = "error"

    def __post_init__(self) -> None:
        if self.id_mapping not in _ID_MAPPINGS:
            raise ValueError(f"sparse feature {self.name!r}: id_mapping must be one of {_ID_MAPPINGS}, got {self.id_mapping!r}")
        if self.pooling not in ("SUM", "MEAN"):
            raise ValueError(f"sparse feature {self.name!r}: pooling must be 'SUM' or 'MEAN', got {self.pooling!r}")
        if self.nulls not in ("error", "empty"):
            raise ValueError(f"sparse feature {self.name!r}: nulls must be 'error' or 'empty', got {self.nulls!r}")
        n = self.num_embeddings
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"sparse feature {self.name!r}: num_embeddings must be a positive int, got {n!r}")
        if self.id_mapping != "none" and n is None:
            raise ValueError(
                f"sparse feature {self.name!r}: id_mapping={self.id_mapping!r} needs num_embeddings (the table's rows); "
                "declare it, e.g. sparse={'" + self.name + "': {'num_embeddings': 1000000, 'id_mapping': "
                f"'{self.id_mapping}'}}}} or num_embeddings=... for every feature"
            )


@dataclass(frozen=True)
class FeatureSpec:
    """Label, dense and sparse columns of a Parquet source, and how they are read.

    Args:
        label: the label column.
        dense: the dense columns, in the order of ``Batch.dense_features``' columns.
        sparse: the sparse features, in KJT key order.
        dense_fill: the value of a null or NaN dense entry.
        dense_transform: ``"none"``, or ``"log1p"``: ``log(1 + max(x, 0))`` (Criteo's counts).
        binary_label: labels must be 0 or 1 (binary cross-entropy); ``False`` takes any finite number.
    """

    label: str
    dense: tuple[str, ...]
    sparse: tuple[SparseFeature, ...]
    dense_fill: float = 0.0
    dense_transform: Literal["none", "log1p"] = "none"
    binary_label: bool = True

    def __post_init__(self) -> None:
        if self.dense_transform not in ("none", "log1p"):
            raise ValueError(f"dense_transform must be 'none' or 'log1p', got {self.dense_transform!r}")
        names = [f.name for f in self.sparse]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"sparse feature names must be unique, got {doubled} more than once")

    @property
    def keys(self) -> list[str]:
        """The KJT keys (sparse feature names), in order."""
        return [f.name for f in self.sparse]

    @property
    def weighted(self) -> bool:
        """Whether any feature has weights (then the KJT carries weights for every id)."""
        return any(f.weights is not None for f in self.sparse)

    def columns(self) -> list[str]:
        """Every column to read, each once: label, dense, ids, weights."""
        cols = [self.label, *self.dense]
        cols += [f.column for f in self.sparse] + [f.weights for f in self.sparse if f.weights is not None]
        return list(dict.fromkeys(cols))

    def with_sizes(self, num_embeddings: Sequence[int]) -> FeatureSpec:
        """The same spec with every feature's ``num_embeddings`` set (one per sparse feature)."""
        if len(num_embeddings) != len(self.sparse):
            raise ValueError(f"expected {len(self.sparse)} table sizes, got {len(num_embeddings)}")
        sparse = tuple(replace(f, num_embeddings=int(n)) for f, n in zip(self.sparse, num_embeddings))
        return replace(self, sparse=sparse)

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One ``EmbeddingBagConfig`` per sparse feature: ``t_<feature>`` over ``[<feature>]``.

        Raises:
            ValueError: a feature has no ``num_embeddings`` yet (size the spec first:
                :func:`lightrec.data.parquet.sizing.size_tables`).
        """
        unsized = [f.name for f in self.sparse if f.num_embeddings is None]
        if unsized:
            raise ValueError(
                f"features {unsized} have no table size yet; size them from the data (ParquetDataModule does) "
                "or declare num_embeddings"
            )
        return [
            EmbeddingBagConfig(
                num_embeddings=int(f.num_embeddings or 0), embedding_dim=embedding_dim, name=f"t_{f.name}",
                feature_names=[f.name], pooling=PoolingType(f.pooling),
            )  # fmt: skip
            for f in self.sparse
        ]


def column_kind(schema: pa.Schema, column: str, path: str, feature: str) -> ColumnKind:
    """``"scalar"`` or ``"list"`` for an id column; :class:`ParquetSchemaError` for anything else."""
    kind = _id_kind(_field(schema, column, path, f"sparse feature {feature!r}").type)
    if kind is None:
        raise ParquetSchemaError(
            f"sparse feature {feature!r} needs integer ids or lists of integer ids, but the column is "
            f"{schema.field(column).type}; cast it when writing, or leave the column out of sparse",
            path=path, column=column, value=str(schema.field(column).type),
        )  # fmt: skip
    return kind


def _id_kind(dtype: pa.DataType) -> ColumnKind | None:
    if pa.types.is_integer(dtype):
        return "scalar"
    if (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and pa.types.is_integer(dtype.value_type):
        return "list"
    return None


def _field(schema: pa.Schema, column: str, path: str, what: str) -> pa.Field:
    if schema.get_field_index(column) < 0:
        raise ParquetSchemaError(
            f"{what} reads column {column!r}, which the file does not have; its columns are {schema.names}",
            path=path, column=column,
        )  # fmt: skip
    return schema.field(column)


def _is_number(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def column_kind_of(dtype: pa.DataType) -> str:
    """What a column holds as far as reading it goes: ``"bool"``, ``"number"`` or ``"list of <kind>"``.

    Types of one kind read alike and are joined by a permissive concat (``int8`` with ``int64``,
    ``int64`` with ``double``, ``list`` with ``large_list``); types of two kinds are not (a scalar and a
    list, a bool and a number). Other types are their own kind (their name).
    """
    if pa.types.is_boolean(dtype):
        return "bool"
    if _is_number(dtype):
        return "number"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return f"list of {column_kind_of(dtype.value_type)}"
    return str(dtype)


def _check_like(spec: FeatureSpec, schema: pa.Schema, path: str, first: tuple[pa.Schema, str]) -> None:
    """Raise :class:`ParquetSchemaError` when a column of ``spec`` has another kind in ``path`` than in ``first``.

    Each file passing :func:`check_schema` alone is not enough: a unit joins row groups of several
    files (the rows of ``shuffle_window`` row groups, a batch across two files), and a list column in
    one file and a scalar one in another cannot be joined.
    """
    first_schema, first_path = first
    for column in spec.columns():
        mine, theirs = schema.field(column).type, first_schema.field(column).type
        if column_kind_of(mine) != column_kind_of(theirs):
            raise ParquetSchemaError(
                f"the column is {mine} ({column_kind_of(mine)}) here but {theirs} ({column_kind_of(theirs)}) in "
                f"{first_path}, the first file; every file must give a column the same kind: write the files with "
                "one schema (cast the column when writing), or read them as separate sources",
                path=path, column=column, value=str(mine),
            )  # fmt: skip


def check_schema(spec: FeatureSpec, schema: pa.Schema, path: str, first: tuple[pa.Schema, str] | None = None) -> None:
    """Raise :class:`ParquetSchemaError` (naming ``path``) when ``schema`` cannot give ``spec``'s features.

    Args:
        spec / schema / path: the features, and the file's Arrow schema and path.
        first: ``(schema, path)`` of the source's first file: each column must also be of the kind it
            is there (:func:`column_kind_of`: scalar or list, bool or number).
    """
    label = _field(schema, spec.label, path, "the label").type
    if not (_is_number(label) or pa.types.is_boolean(label)):
        raise ParquetSchemaError(
            f"the label must be a number or a bool, but the column is {label}", path=path, column=spec.label,
            value=str(label),
        )  # fmt: skip
    for column in spec.dense:
        dtype = _field(schema, column, path, "a dense feature").type
        if not _is_number(dtype):
            raise ParquetSchemaError(
                f"dense features must be numbers, but the column is {dtype}; leave it out of dense (ids belong "
                "in sparse)", path=path, column=column, value=str(dtype),
            )  # fmt: skip
    for feature in spec.sparse:
        kind = column_kind(schema, feature.column, path, feature.name)
        if feature.weights is None:
            continue
        wtype = _field(schema, feature.weights, path, f"the weights of {feature.name!r}").type
        listed = pa.types.is_list(wtype) or pa.types.is_large_list(wtype)
        if kind != "list" or not listed or not _is_number(wtype.value_type):
            raise ParquetSchemaError(
                f"weights of feature {feature.name!r} must be a list of numbers parallel to a list id column; got "
                f"ids {schema.field(feature.column).type} and weights {wtype}",
                path=path, column=feature.weights, value=str(wtype),
            )  # fmt: skip
    if first is not None:
        _check_like(spec, schema, path, first)


def _sparse_from_dict(name: str, options: str | Mapping[str, Any], defaults: Mapping[str, Any]) -> SparseFeature:
    if isinstance(options, str):
        return SparseFeature(name=name, column=options, **defaults)
    if not isinstance(options, Mapping):
        raise TypeError(f"sparse[{name!r}] must be a column name or a dict of options, got {type(options).__name__}")
    unknown = sorted(set(options) - set(_SPARSE_OPTIONS))
    if unknown:
        raise ValueError(f"sparse[{name!r}] has unknown options {unknown}; the options are {list(_SPARSE_OPTIONS)}")
    merged = {**defaults, **{k: v for k, v in options.items() if k != "column"}}
    return SparseFeature(name=name, column=str(options.get("column", name)), **merged)


def _expand(names: Sequence[str], schema: pa.Schema) -> list[str]:
    """Column names, with glob patterns (``"int_*"``) expanded to the schema's matching columns in schema order."""
    out: list[str] = []
    for name in names:
        if any(c in name for c in "*?["):
            matched = [f for f in schema.names if fnmatch.fnmatchcase(f, name)]
            if not matched:
                raise ValueError(f"the pattern {name!r} matches no column; the columns are {schema.names}")
            out += matched
        else:
            out.append(name)
    return list(dict.fromkeys(out))


class FeatureOptions(TypedDict, total=False):
    """:func:`build_spec`'s keywords: defaults of every sparse feature (a dict entry of ``sparse``
    overrides them), and how dense columns and the label are read (see :class:`FeatureSpec`)."""

    num_embeddings: int | None
    id_mapping: IdMapping
    nulls: NullIds
    pooling: Literal["SUM", "MEAN"]
    dense_fill: float
    dense_transform: Literal["none", "log1p"]
    binary_label: bool


_FEATURE_DEFAULTS = ("num_embeddings", "id_mapping", "nulls", "pooling")


def build_spec(
    schema: pa.Schema,
    path: str,
    label: str,
    dense: Sequence[str] | Literal["auto"] = (),
    sparse: Sequence[str] | Mapping[str, str | Mapping[str, Any]] | Literal["auto"] = "auto",
    **options: Unpack[FeatureOptions],
) -> FeatureSpec:
    """The :class:`FeatureSpec` of the arguments, checked against ``schema`` (the first file's).

    Args:
        schema: the Arrow schema of a file of the source (``path``, for messages).
        label / dense / sparse: as :class:`~lightrec.data.ParquetDataModule` takes them; names in the
            lists may be glob patterns (``"int_*"``: the matching columns, in the schema's order).
        **options: :class:`FeatureOptions`.

    Raises:
        ParquetSchemaError: a column is missing or of the wrong type.
        ValueError: the arguments contradict each other (no sparse feature, a column used twice).
    """
    unknown = sorted(set(options) - set(FeatureOptions.__annotations__))
    if unknown:
        raise TypeError(f"build_spec got unknown options {unknown}; the options are {list(FeatureOptions.__annotations__)}")
    defaults: dict[str, Any] = {k: v for k, v in options.items() if k in _FEATURE_DEFAULTS}
    read: dict[str, Any] = {k: v for k, v in options.items() if k not in _FEATURE_DEFAULTS}
    _field(schema, label, path, "the label")
    if dense == "auto":
        dense_cols = [f.name for f in schema if f.name != label and pa.types.is_floating(f.type)]
    elif isinstance(dense, str):
        raise TypeError(f"dense must be a list of column names or 'auto', got the string {dense!r}")
    else:
        dense_cols = _expand(dense, schema)
    if sparse == "auto":
        taken = {label, *dense_cols}
        features = [
            SparseFeature(name=f.name, column=f.name, **defaults)
            for f in schema
            if f.name not in taken and _id_kind(f.type) is not None
        ]
    elif isinstance(sparse, Mapping):
        features = [_sparse_from_dict(str(name), options, defaults) for name, options in sparse.items()]
    elif isinstance(sparse, str):
        raise TypeError(f"sparse must be a list of column names, a dict or 'auto', got the string {sparse!r}")
    else:
        features = [SparseFeature(name=c, column=c, **defaults) for c in _expand([str(c) for c in sparse], schema)]
    if not features:
        raise ValueError(
            f"no sparse features: sparse={sparse!r} found no integer or list-of-integer column in {path} "
            f"(columns: {schema.names}); name the id columns in sparse=[...]"
        )
    used = [label, *dense_cols, *dict.fromkeys(f.column for f in features)]  # features may share a column
    doubled = sorted({c for c in used if used.count(c) > 1})
    if doubled:
        raise ValueError(f"columns {doubled} are used twice (label, dense and sparse must be different columns)")
    spec = FeatureSpec(label=label, dense=tuple(dense_cols), sparse=tuple(features), **read)
    check_schema(spec, schema, path)
    return spec
