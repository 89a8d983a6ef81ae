"""Input checks shared by every embedding collection: feature keys, table lists and id ranges.

Errors name what a user can act on: the feature, the table, the offending id and the valid range.
``check_ids`` is an ``torch.fx.wrap``-ed leaf so collections stay fx-traceable (the data-dependent
check becomes one graph node instead of failing on proxies).

Two kinds of checks live here, on purpose in one file:

* **Protective checks, always on**: ids outside a table (``EmbeddingIdError``), a batch missing a
  feature the collection reads, duplicated KJT keys, ids or lengths that are not int32/int64, parts
  whose sizes disagree, negative lengths, NaN weights and values beyond the last feature's lengths
  (``check_collection_input``: dtypes and sizes, one sum of the host-side ``length_per_key``, and
  on the host one pass over the lengths and weights), inconsistent jagged lengths (``validate``).
  These catch input that would give wrong numbers or crash a kernel, also in torchrec's lenient mode.
* **Strict checks, off by default** (torchrec's behaviour): a KJT carrying keys the collection does
  not read (models with several collections fed from one KJT rely on them being ignored), a
  feature read by several tables, a collection with ``tables=[]``. Turn them on for a process with
  ``set_strict_checks(True)`` or for a block with ``with strict_checks():``.
"""

import contextlib
from collections.abc import Iterator
from typing import List, Optional, Tuple

import torch

from lightrec.sparse.jagged import SparseValueError
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.kjt_checks import check_id_dtypes, check_layout_sizes, check_lengths_and_weights

__all__ = [
    "BOUNDS_CHECK_MODES",
    "EmbeddingIdError",
    "FeatureKeyError",
    "apply_bounds_check",
    "check_collection_input",
    "check_feature_keys",
    "check_ids",
    "check_table_features",
    "features_of_several_tables",
    "set_strict_checks",
    "strict_checks",
    "strict_checks_enabled",
]

BOUNDS_CHECK_MODES = ("error", "clamp", "skip")


class EmbeddingIdError(IndexError):
    """An id outside ``[0, num_embeddings)`` of the table its feature looks up."""


class FeatureKeyError(KeyError):
    """A batch whose feature keys do not match the features a collection serves."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0]) if self.args else ""


_STRICT = [False]  # a list so the setting is shared by every importer without a global statement


def set_strict_checks(enabled: bool) -> None:
    """Turn lightrec's strict input checks on or off for this process (default off, as torchrec).

    Strict: a KJT's keys must be exactly the collection's features, a feature is read by one
    table only, a collection needs at least one table, and a managed-collision table's raw ids
    must be inside its ``input_hash_size`` (else they are folded into it).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_strict_checks(enabled=...) takes a bool, got {enabled!r}")
    _STRICT[0] = enabled


def strict_checks_enabled() -> bool:
    """Whether the strict checks are on (see ``set_strict_checks``)."""
    return _STRICT[0]


@contextlib.contextmanager
def strict_checks(enabled: bool = True) -> Iterator[None]:
    """``with strict_checks():`` turns the strict checks on inside the block (and restores after)."""
    previous = _STRICT[0]
    set_strict_checks(enabled)
    try:
        yield
    finally:
        _STRICT[0] = previous


def check_feature_keys(given: List[str], expected: List[str], where: str) -> None:
    """Raise ``FeatureKeyError`` for missing or duplicated keys (order does not matter).

    Keys the collection does not read are ignored, as in torchrec, unless the strict checks are on
    (``set_strict_checks``); then they are an error too.
    """
    given_set, expected_set = set(given), set(expected)
    strict = _STRICT[0]
    if expected_set <= given_set and len(given) == len(given_set) and (not strict or given_set == expected_set):
        return
    missing = [k for k in expected if k not in given_set]
    unknown = [k for k in given if k not in expected_set] if strict else []
    dupes = sorted({k for k in given if given.count(k) > 1})
    parts = []
    if missing:
        parts.append(f"missing features {missing}")
    if unknown:
        parts.append(f"unknown features {unknown}")
    if dupes:
        parts.append(f"duplicated features {dupes}")
    raise FeatureKeyError(
        f"{where}: the KeyedJaggedTensor keys do not match the collection's features: "
        + "; ".join(parts)
        + f". The collection serves {expected}; build the batch with "
        + ("exactly these keys (strict checks are on)." if strict else "at least these keys.")
    )


def check_collection_input(
    features: KeyedJaggedTensor, expected: List[str], where: str, weighted: bool = False
) -> None:
    """Every collection's input check: the keys (``check_feature_keys``) and what is never lenient.

    Always on, whatever ``set_strict_checks`` says, because each case would otherwise be silently
    wrong or fail deep inside a kernel with a message that names no feature:

    * ids or lengths that are not int32/int64 (a float id is not a row);
    * parts whose sizes disagree: values or lengths that are not 1-D, weights that are not one per
      id, lengths not ``batch_size`` per key, a ``stride`` that disagrees with the lengths;
    * a negative length, and (for a collection that reads weights, ``weighted``) a NaN or
      infinite weight;
    * values beyond the last feature's lengths (the lookup would drop them).

    Cheap by design: dtypes and sizes are host metadata; the surplus check sums the KJT's
    ``length_per_key``, which the lookup computes anyway. The two checks that read the data (a
    negative length, a non-finite weight) run here only for a KJT on the host, where they cost a
    pass over the lengths (and weights) and no device sync; on an accelerator the lookup kernels'
    own id check (one host read the lookup does anyway, ``lightrec.kernels.input_checks``) finds
    them. The surplus check is skipped (not forced) for an accelerator KJT whose per-key sizes are
    not yet on the host, so it adds no device sync to the sharded input path.

    Args:
        features: the batch the collection was called with.
        expected: the collection's feature names.
        where: the collection, for the message.
        weighted: whether the collection reads the KJT's per-id weights (``is_weighted``).
    """
    check_feature_keys(features.keys(), expected, where)
    keys, values, lengths = features.keys(), features.values(), features.lengths()
    if not keys:
        return
    check_id_dtypes(keys, values, lengths)
    variable = features.variable_stride_per_key()
    strides = features.stride_per_key_per_rank() if variable else None
    check_layout_sizes(keys, values, features.weights_or_none(), lengths, None if variable else features.stride(), strides)
    if values.device.type == "cpu" and not torch.compiler.is_compiling():
        weights = features.weights_or_none() if weighted else None
        check_lengths_and_weights(keys, lengths, weights, features.stride_per_key() if variable else None)
    per_key = features.length_per_key_or_none()
    if per_key is None and values.device.type == "cpu":
        per_key = features.length_per_key()  # cached on the KJT: the lookup reuses it
    if per_key is None:
        return
    total = sum(per_key)
    if torch.compiler.is_compiling():
        # torch.compile / torch.export see data-dependent sizes: a Python branch on them would break
        # the graph, so record the equality as a runtime assert of the compiled program instead
        # (without a message: torch 2.11's dynamo breaks the graph on torch._check's message callable).
        torch._check(total == values.numel())
        return
    if total != values.numel():
        raise SparseValueError(
            f"{where}: the KeyedJaggedTensor has {values.numel()} values but its lengths count {total} "
            f"({values.numel() - total:+d} beyond the last feature {keys[-1]!r}); lengths must count every value "
            "exactly once, or the surplus ids would be dropped silently"
        )


def check_table_features(tables_features: List[Tuple[str, List[str]]], where: str) -> None:
    """The table-list checks that are strict-only: ``tables=[]`` and a feature read by several tables.

    Args:
        tables_features: ``(table name, feature names)`` per table, in order.
        where: the collection, for the message.
    """
    if not _STRICT[0]:
        return
    if len(tables_features) == 0:
        raise ValueError(
            f"{where} needs at least one table config, got tables=[] (strict checks are on; "
            "set_strict_checks(False) allows an empty collection, as torchrec does)"
        )
    owner: dict[str, str] = {}
    for table, features in tables_features:
        for f in features:
            if f in owner:
                raise ValueError(
                    f"{where}: feature {f!r} is listed by tables {owner[f]!r} and {table!r}; with strict checks on "
                    "a feature looks up exactly one table (several features may share one table)"
                )
            owner[f] = table


def features_of_several_tables(tables_features: List[List[str]]) -> List[str]:
    """The features (sorted) that more than one table lists; ``tables_features``: each table's features.

    Collections that route a feature to one table (sharded, managed-collision) refuse them.
    """
    listed = [f for features in tables_features for f in features]
    return sorted({f for f in listed if listed.count(f) > 1})


@torch.fx.wrap
def check_ids(
    values: torch.Tensor,
    lengths: torch.Tensor,
    num_embeddings: int,
    table: str,
    features: List[str],
    stride: int,
) -> torch.Tensor:
    """Raise ``EmbeddingIdError`` if any id of ``values`` is outside ``[0, num_embeddings)``.

    Args:
        values: ``[N]`` ids of ``features`` (key-major, as in a KJT slice).
        lengths: ``[len(features) * stride]`` lengths of those ids.
        num_embeddings / table: the table's rows and name (for the message).
        features: the features whose ids ``values`` holds, in order.
        stride: batch size.

    Returns:
        ``values`` unchanged (so the check is a node that the lookup depends on).
    """
    bad = (values < 0) | (values >= num_embeddings)
    # Inside torch.compile a host-side check would break the graph; assert on the device instead.
    # (TorchScript skips the branch: it cannot compile is_compiling.)
    if not torch.jit.is_scripting():
        if torch.compiler.is_compiling():
            torch._assert_async(
                torch.logical_not(bad.any()),
                f"an id of features {features} is outside [0, {num_embeddings}) of table '{table}'",
            )
            return values
    if values.device.type != "cpu" and lengths.numel() > 0:
        # On an accelerator check_collection_input does not read the lengths (a device sync): a
        # negative one is found here, in the host read this check makes anyway.
        flags = torch.stack([bad.any(), (lengths < 0).any()]).cpu()
        if bool(flags[1]):
            bag = int(torch.nonzero(lengths < 0)[0, 0])
            raise SparseValueError(
                f"feature '{features[bag // max(stride, 1)]}' has a negative length: {int(lengths[bag])} ids for "
                f"sample {bag % max(stride, 1)}; a length counts the ids of one sample and must be non-negative"
            )
        any_bad = bool(flags[0])
    else:
        any_bad = bool(bad.any())
    if any_bad:
        position = int(torch.nonzero(bad)[0, 0])
        feature, sample = _locate(lengths, position, stride)
        raise EmbeddingIdError(
            f"feature '{features[feature]}' (sample {sample}) has id {int(values[position])} but table "
            f"'{table}' has {num_embeddings} rows: ids must be in [0, {num_embeddings}). Hash or take the "
            "id modulo num_embeddings, enlarge the table, or pass bounds_check='clamp' or 'skip'."
        )
    return values


def _locate(lengths: torch.Tensor, position: int, stride: int) -> Tuple[int, int]:
    """(feature index, sample index) of value ``position`` in a key-major jagged layout."""
    ends = torch.cumsum(lengths.long(), 0)
    bag = int(torch.searchsorted(ends, torch.tensor(position, dtype=ends.dtype, device=ends.device), right=True))
    return bag // max(stride, 1), bag % max(stride, 1)


def apply_bounds_check(
    mode: str, values: torch.Tensor, lengths: torch.Tensor, weights: Optional[torch.Tensor],
    num_embeddings: int, table: str, features: List[str], stride: int,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Apply the collection's ``bounds_check`` policy to one table's ids.

    ``"error"`` raises (see ``check_ids``); ``"clamp"`` maps bad ids to the nearest valid row;
    ``"skip"`` drops bad ids and shortens their bags (a bag left empty pools to zeros).

    Returns:
        ``(values, lengths, weights)`` to look up.
    """
    if mode == "error":
        return check_ids(values, lengths, num_embeddings, table, features, stride), lengths, weights
    if mode == "clamp":
        return values.clamp(0, num_embeddings - 1), lengths, weights
    keep = (values >= 0) & (values < num_embeddings)
    bag = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths.long(), output_size=values.numel()
    )
    dropped = torch.bincount(bag[~keep], minlength=lengths.numel()).to(lengths.dtype)
    return values[keep], lengths - dropped, (weights[keep] if weights is not None else None)
