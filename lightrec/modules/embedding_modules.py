"""Unsharded embedding collections: many tables, one ``KeyedJaggedTensor`` in, one result out.

``EmbeddingBagCollection`` pools (SUM/MEAN) each feature's ids per sample and returns a
``KeyedTensor`` ``[B, sum(D)]``; ``EmbeddingCollection`` returns every id's row as a
``JaggedTensor`` per feature. These are the plain-PyTorch modules users prototype with and the
reference the sharded and fused versions are tested against; ``DistributedModelParallel``
replaces them with batched, fused, sharded equivalents that keep the same state-dict keys.

Both are buildable on ``device="meta"`` (no memory is allocated; the sharder materialises only
the local shards later).

As in torchrec, a KJT may carry keys a collection does not read (they are ignored), a feature may
be read by several tables (its pooled output is then named ``feature@table``), and ``tables=[]``
gives an empty collection; ``feature_checks.set_strict_checks(True)`` turns these into errors.

No ``from __future__ import annotations`` here: ``torch.fx`` copies ``forward``'s annotations into
the code it generates, which TorchScript must then compile (an fx-traced collection is scripted).
"""

import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lightrec._compat import is_fx_symbolic_tracing as is_fx_tracing
from lightrec.modules.collection_interfaces import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
    embedding_names_by_table,
    get_embedding_names_by_table,
)
from lightrec.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from lightrec.modules.feature_checks import (
    BOUNDS_CHECK_MODES,
    apply_bounds_check,
    check_collection_input,
    check_table_features,
)
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from lightrec.sparse._ops import complete_cumsum

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionInterface",
    "EmbeddingCollection",
    "EmbeddingCollectionInterface",
    "embedding_names_by_table",
    "get_embedding_names_by_table",
    "table_lists",
]


# ModuleDict keys may not shadow its own attributes.
_RESERVED_TABLE_NAMES = frozenset(n for n in dir(nn.ModuleDict) if not n.startswith("_"))


def _weight_of(table: nn.Module) -> torch.Tensor:
    """A table module's weight (eager code only: ``nn.Module`` attributes are typed loosely)."""
    weight = table.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def _init_tables(configs: Sequence[BaseEmbeddingConfig], tables: nn.ModuleDict) -> None:
    """Initialise every table from its config (uniform range or ``init_fn``); no-op on meta."""
    for t in configs:
        t.init_weight(_weight_of(tables[t.name]))


def table_lists(tables: Sequence[BaseEmbeddingConfig]) -> Tuple[List[str], List[List[str]], List[int], List[int]]:
    """``(names, feature names, rows, dims)``, one entry per table: the plain lists a collection's
    forward reads (:func:`ids_per_table`, :func:`ids_per_feature`), since TorchScript cannot iterate
    config dataclasses. Every collection, plain or quantized, keeps them."""
    return (
        [t.name for t in tables],
        [list(t.feature_names) for t in tables],
        [t.num_embeddings for t in tables],
        [t.embedding_dim for t in tables],
    )


def _check_tables(tables: Sequence[BaseEmbeddingConfig], where: str) -> list[str]:
    """Validate a table list; return the flat feature order (table by table; a feature read by
    several tables appears once per table)."""
    names = [t.name for t in tables]
    clashes = sorted(n for n in names if n in _RESERVED_TABLE_NAMES or "." in n)
    if clashes:
        raise ValueError(
            f"{where}: table names {clashes} cannot be used (they clash with nn.ModuleDict attributes "
            "or contain '.'); rename the tables, e.g. 't_items'"
        )
    if any(not n for n in names):
        raise ValueError(f"{where}: every table needs a non-empty name, got names {names}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where}: table names must be unique, duplicated: {dupes}")
    features: list[str] = []
    for t in tables:
        if not t.feature_names:
            raise ValueError(f"{where}: table {t.name!r} has no feature_names; name the features that look it up")
        twice = sorted({f for f in t.feature_names if list(t.feature_names).count(f) > 1})
        if twice:
            raise ValueError(f"{where}: table {t.name!r} lists features {twice} more than once; list each once")
        features.extend(t.feature_names)
    check_table_features([(t.name, list(t.feature_names)) for t in tables], where)
    return features


def _warn_float32_storage(tables: Sequence[BaseEmbeddingConfig], where: str) -> None:
    """torchrec trains a table of ``data_type=FP16`` in fp16; lightrec's training kernels update float32 rows,
    so such a table takes twice the memory its user expects: say so once per collection (the planner
    counts what is allocated)."""
    other = [t for t in tables if t.data_type != DataType.FP32]
    if other:
        names, kinds = sorted({t.name for t in other}), sorted({t.data_type.value for t in other})
        warnings.warn(
            f"{where}: tables {names} have data_type {kinds}, but lightrec trains tables in float32 (4 bytes a "
            "value, as allocated and as the planner counts them); data_type changes nothing in training. For "
            "smaller tables at serving time, quantize at export: lightrec.inference.quantize(model, dtype='fp16' "
            "or 'int8')",
            UserWarning,
            stacklevel=3,
        )


def check_collection_tables(
    tables: Sequence[BaseEmbeddingConfig], config_type: type, where: str, bounds_check: str
) -> list[str]:
    """The arguments every collection (plain, quantized) checks: tables of ``config_type`` with valid,
    unique names, and a known ``bounds_check`` mode. Returns the flat feature order (``_check_tables``).

    Raises:
        TypeError: a table is not a ``config_type``.
        ValueError: bad table names or features, or an unknown ``bounds_check``.
    """
    for t in tables:
        if not isinstance(t, config_type):
            raise TypeError(f"{where} takes {config_type.__name__} tables, got {type(t).__name__}")
    feature_order = _check_tables(tables, where)
    if bounds_check not in BOUNDS_CHECK_MODES:
        raise ValueError(f"bounds_check must be one of {BOUNDS_CHECK_MODES}, got {bounds_check!r}")
    return feature_order


def ids_per_table(
    features: KeyedJaggedTensor,
    feature_order: List[str],
    table_names: List[str],
    table_features: List[List[str]],
    table_rows: List[int],
    is_weighted: bool,
    bounds_check: str,
    where: str,
) -> Tuple[int, List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]]:
    """Align a KJT to ``feature_order`` and cut it into one bounds-checked slice per table.

    Shared by every pooled collection (plain and quantized), so key checks, weight checks and id
    checks behave the same everywhere. Tables own consecutive features of ``feature_order``.

    Returns:
        ``(stride, [(ids [N_t], lengths [F_t * B], weights [N_t] | None) per table])``; for a
        variable-batch KJT a table's lengths hold ``sum_f B_f`` entries.
    """
    if not torch.jit.is_scripting():  # TorchScript skips this branch; it cannot compile set logic
        if not is_fx_tracing():
            check_collection_input(features, feature_order, where, weighted=is_weighted)
            if is_weighted and features.weights_or_none() is None:
                raise ValueError(
                    f"{where}(is_weighted=True) needs per-id weights, but the KeyedJaggedTensor has "
                    "weights=None; pass weights=... or build the collection with is_weighted=False"
                )
    features = features.permute_to_keys(feature_order)
    weights: Optional[torch.Tensor] = None
    if is_weighted:
        # weights() (a Tensor, not Optional) keeps an fx-traced graph scriptable
        weights = features.weights()
    stride = features.stride()
    offset_per_key = features.offset_per_key()
    lengths_offset_per_key = features.lengths_offset_per_key()  # k * B, or each key's own batch (VBE)
    lengths = features.lengths()
    values = features.values()
    out: List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = []
    first = 0
    for t in range(len(table_names)):
        last = first + len(table_features[t])
        start, end = offset_per_key[first], offset_per_key[last]
        ids = values[start:end]
        ids_weights = weights[start:end] if weights is not None else None
        if not torch.jit.is_scripting():
            if ids_weights is not None and torch.compiler.is_compiling():
                # torch.export sizes each slice by data-dependent bounds anew: state they are one size
                torch._check(ids_weights.shape[0] == ids.shape[0])
        out.append(
            apply_bounds_check(
                bounds_check,
                ids,
                lengths[lengths_offset_per_key[first] : lengths_offset_per_key[last]],
                ids_weights,
                table_rows[t],
                table_names[t],
                table_features[t],
                stride,
            )
        )
        first = last
    return stride, out


def ids_per_feature(
    features: KeyedJaggedTensor,
    feature_order: List[str],
    table_names: List[str],
    table_features: List[List[str]],
    table_rows: List[int],
    bounds_check: str,
    where: str,
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Align a KJT to ``feature_order`` and cut it into one bounds-checked slice per feature.

    The sequence collections' twin of :func:`ids_per_table` (plain and quantized alike).

    Returns:
        ``[(ids [N_f], lengths [B_f]) per feature]`` in ``feature_order`` (``B_f = B`` unless the KJT
        is variable-batch).
    """
    if not torch.jit.is_scripting():  # TorchScript skips this branch; it cannot compile set logic
        if not is_fx_tracing():
            check_collection_input(features, feature_order, where)
    features = features.permute_to_keys(feature_order)
    stride = features.stride()
    offset_per_key = features.offset_per_key()
    lengths_offset_per_key = features.lengths_offset_per_key()
    lengths = features.lengths()
    values = features.values()
    out: List[Tuple[torch.Tensor, torch.Tensor]] = []
    f = 0
    for t in range(len(table_names)):
        for name in table_features[t]:
            ids, f_lengths, _ = apply_bounds_check(
                bounds_check,
                values[offset_per_key[f] : offset_per_key[f + 1]],
                lengths[lengths_offset_per_key[f] : lengths_offset_per_key[f + 1]],
                None,
                table_rows[t],
                table_names[t],
                [name],
                stride,
            )
            out.append((ids, f_lengths))
            f += 1
    return out


class EmbeddingBagCollection(EmbeddingBagCollectionInterface):
    """Pooled embedding tables: ``KeyedJaggedTensor`` → ``KeyedTensor`` ``[B, sum_f D_f]``.

    Output keys are the feature names in table order (a table's features in their listed order);
    the block of feature ``f`` is ``D`` wide, where ``D`` is its table's ``embedding_dim``.

    Args:
        tables: one ``EmbeddingBagConfig`` per table.
        is_weighted: use the KJT's per-id weights (``per_sample_weights``); the KJT must carry them.
        device: where to allocate the tables; ``"meta"`` allocates nothing.
        bounds_check: what to do with ids outside ``[0, num_embeddings)``: ``"error"`` (default),
            ``"clamp"`` or ``"skip"``.
    """

    __jit_unused_properties__ = ["device"]  # TorchScript cannot compile next(iter(...))

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        bounds_check: str = "error",
    ) -> None:
        super().__init__()
        self._feature_order = check_collection_tables(tables, EmbeddingBagConfig, "EmbeddingBagCollection", bounds_check)
        _warn_float32_storage(tables, "EmbeddingBagCollection")
        self._embedding_bag_configs = list(tables)
        self._is_weighted = is_weighted
        self._bounds_check = bounds_check
        self.embedding_bags = nn.ModuleDict()
        for t in tables:
            mode = "sum" if t.pooling == PoolingType.SUM else "mean"
            self.embedding_bags[t.name] = nn.EmbeddingBag(
                t.num_embeddings, t.embedding_dim, mode=mode, include_last_offset=True, device=device
            )
        self._device_arg = torch.device(device) if device is not None else torch.device("cpu")
        self._embedding_names: list[str] = [n for names in embedding_names_by_table(tables) for n in names]
        self._lengths_per_embedding: list[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._table_names, self._table_features, self._table_rows, self._table_dims = table_lists(tables)
        self._table_mean: List[bool] = [t.pooling == PoolingType.MEAN for t in tables]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every table from its config (uniform range or ``init_fn``); no-op on meta."""
        _init_tables(self._embedding_bag_configs, self.embedding_bags)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        return list(self._feature_order)

    def embedding_names(self) -> list[str]:
        """Output keys: feature names in table order (``feature@table`` for a shared feature)."""
        return list(self._embedding_names)

    @property
    def device(self) -> torch.device:
        if len(self.embedding_bags) == 0:
            return self._device_arg
        return _weight_of(next(iter(self.embedding_bags.values()))).device

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every feature's ids.

        Args:
            features: KJT holding at least this collection's feature names as keys (any order;
                other keys are ignored unless strict checks are on). A variable-batch KJT
                (``stride_per_key_per_rank`` + ``inverse_indices``) is pooled per key's own batch
                and expanded to the full batch through its inverse indices, as torchrec does.

        Returns:
            ``KeyedTensor`` with keys ``embedding_names()`` and values ``[B, sum D]``.
        """
        stride, slices = ids_per_table(
            features, self._feature_order, self._table_names, self._table_features, self._table_rows,
            self._is_weighted, self._bounds_check, "EmbeddingBagCollection",
        )  # fmt: skip
        per_table: List[torch.Tensor] = []
        t = 0
        for _, bag in self.embedding_bags.items():
            ids, bag_lengths, id_weights = slices[t]
            weight = torch.jit.annotate(torch.Tensor, bag.weight)  # a Tensor to type checkers too
            per_table.append(_pool(weight, ids, bag_lengths, id_weights, self._table_mean[t]))
            t += 1
        if not torch.jit.is_scripting():  # eager only: a traced/scripted graph takes fixed-batch KJTs
            if not is_fx_tracing() and features.variable_stride_per_key():
                return self._expand_variable_batch(features, per_table)
        pooled: List[torch.Tensor] = []
        for t in range(len(per_table)):
            num_features = len(self._table_features[t])
            dim = self._table_dims[t]
            # [num_features * B, D] (feature-major) -> [B, num_features * D] (feature blocks side by side)
            pooled.append(
                per_table[t].view(num_features, stride, dim).transpose(0, 1).reshape(stride, num_features * dim)
            )
        if len(pooled) == 0:  # tables=[]: no columns, one row per sample
            pooled.append(torch.zeros(stride, 0, device=features.device()))
        return KeyedTensor(
            keys=self._embedding_names,
            length_per_key=self._lengths_per_embedding,
            values=torch.cat(pooled, dim=1),
            key_dim=1,
        )

    @torch.jit.unused
    def _expand_variable_batch(self, features: KeyedJaggedTensor, per_table: List[torch.Tensor]) -> KeyedTensor:
        """Pooled rows of a variable-batch KJT (``[B_f, D]`` per feature) -> ``[B, sum D]``.

        Row ``b`` of feature ``f`` is the pooled bag ``inverse_indices[1][i_f][b]`` of ``f``.
        """
        inverse = features.inverse_indices_or_none()
        if inverse is None:
            raise ValueError(
                "EmbeddingBagCollection got a variable-batch KeyedJaggedTensor (stride_per_key_per_rank="
                f"{features.stride_per_key_per_rank()}) without inverse_indices; pass inverse_indices=(keys, "
                "[len(keys), B]) so every sample of the batch gets its row"
            )
        row_of_key = {k: i for i, k in enumerate(inverse[0])}
        batch_of = dict(zip(features.keys(), features.stride_per_key(), strict=True))
        blocks: List[torch.Tensor] = []
        for t, pooled in enumerate(per_table):
            first = 0
            for f in self._table_features[t]:
                if f not in row_of_key:
                    raise ValueError(f"inverse_indices has no row for feature {f!r}; its keys are {inverse[0]}")
                rows = pooled[first : first + batch_of[f]]
                blocks.append(rows.index_select(0, inverse[1][row_of_key[f]].long()))
                first += batch_of[f]
        values = torch.cat(blocks, dim=1) if blocks else torch.zeros(inverse[1].size(-1), 0, device=features.device())
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._lengths_per_embedding, values=values)

    def extra_repr(self) -> str:
        return f"is_weighted={self._is_weighted}, bounds_check={self._bounds_check!r}"


def _pool(
    weight: torch.Tensor,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    id_weights: Optional[torch.Tensor],
    mean: bool,
) -> torch.Tensor:
    """``[num_bags, D]`` SUM (or MEAN when ``mean``) of ``weight`` rows per bag; empty bags give zeros."""
    offsets = complete_cumsum(lengths).to(ids.dtype)
    if id_weights is not None:  # embedding_bag wants the table's dtype; cast as fbgemm does, not refuse
        id_weights = id_weights.to(weight.dtype)
    if mean and id_weights is not None:
        # nn.EmbeddingBag has no weighted mean: weighted sum divided by the ids per bag (fbgemm's rule).
        summed = F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=id_weights,
                                 include_last_offset=True, norm_type=2.0)
        return summed / lengths.clamp(min=1).to(summed.dtype).unsqueeze(1)
    mode = "mean" if mean else "sum"
    return F.embedding_bag(
        ids, weight, offsets, mode=mode, per_sample_weights=id_weights, include_last_offset=True, norm_type=2.0
    )


class EmbeddingCollection(EmbeddingCollectionInterface):
    """Unpooled embedding tables: ``KeyedJaggedTensor`` → ``{feature: JaggedTensor}``.

    The JaggedTensor of feature ``f`` has values ``[N_f, D]`` (one row per id, in input order)
    and the feature's lengths, so sequence models can attend over them.

    Args:
        tables: one ``EmbeddingConfig`` per table.
        device: where to allocate; ``"meta"`` allocates nothing.
        bounds_check: ``"error"`` (default), ``"clamp"`` or ``"skip"``.
    """

    __jit_unused_properties__ = ["device"]  # TorchScript cannot compile next(iter(...))

    def __init__(
        self,
        tables: list[EmbeddingConfig],
        device: torch.device | str | None = None,
        need_indices: bool = False,
        bounds_check: str = "error",
    ) -> None:
        super().__init__()
        self._feature_order = check_collection_tables(tables, EmbeddingConfig, "EmbeddingCollection", bounds_check)
        _warn_float32_storage(tables, "EmbeddingCollection")
        self._embedding_configs = list(tables)
        self._bounds_check = bounds_check
        self._need_indices = need_indices
        self._device_arg = torch.device(device) if device is not None else torch.device("cpu")
        self._embedding_names_by_table: List[List[str]] = embedding_names_by_table(tables)
        self.embeddings = nn.ModuleDict()
        for t in tables:
            self.embeddings[t.name] = nn.Embedding(t.num_embeddings, t.embedding_dim, device=device)
        self._table_names, self._table_features, self._table_rows, _ = table_lists(tables)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every table from its config (uniform range or ``init_fn``); no-op on meta."""
        _init_tables(self._embedding_configs, self.embeddings)

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return self._embedding_configs

    def feature_names(self) -> list[str]:
        return list(self._feature_order)

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_names(self) -> list[str]:
        """Output keys: feature names in table order (``feature@table`` for a shared feature)."""
        return [n for names in self._embedding_names_by_table for n in names]

    @property
    def device(self) -> torch.device:
        if len(self.embeddings) == 0:
            return self._device_arg
        return _weight_of(next(iter(self.embeddings.values()))).device

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Look up every id; returns ``{feature: JaggedTensor(values [N_f, D], lengths [B_f])}``.

        With ``need_indices=True`` each JaggedTensor's ``weights`` holds the ids looked up
        (torchrec's convention). Keys are ``embedding_names()``; a variable-batch KJT gives each
        feature its own batch size ``B_f``.
        """
        checked = ids_per_feature(
            features, self._feature_order, self._table_names, self._table_features, self._table_rows,
            self._bounds_check, "EmbeddingCollection",
        )  # fmt: skip
        out: Dict[str, JaggedTensor] = {}
        f = 0
        t = 0
        for _, embedding in self.embeddings.items():
            for name in self._embedding_names_by_table[t]:
                ids, f_lengths = checked[f]
                out[name] = JaggedTensor(
                    values=F.embedding(ids, torch.jit.annotate(torch.Tensor, embedding.weight)),
                    weights=ids if self._need_indices else None,
                    lengths=f_lengths,
                    offsets=None,
                )
                f += 1
            t += 1
        return out

    def extra_repr(self) -> str:
        return f"need_indices={self._need_indices}, bounds_check={self._bounds_check!r}"

