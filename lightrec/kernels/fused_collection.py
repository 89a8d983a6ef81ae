"""Single-process embedding collections with the optimizer fused into backward.

:class:`FusedEmbeddingBagCollection` has the contract of ``lightrec.modules.EmbeddingBagCollection``
(``KeyedJaggedTensor`` in, ``KeyedTensor [B, sum D]`` out, keys = feature names in table order,
``state_dict`` keys ``embedding_bags.<table>.weight``) but looks tables up with batched kernels,
one call per pooling type, and updates the touched rows inside ``loss.backward()``. There is no
dense embedding gradient and nothing for a dense optimizer to do; ``fused_optimizer`` carries the
learning rate and the optimizer state for checkpoints and schedulers::

    ebc = FusedEmbeddingBagCollection(tables, fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                            "learning_rate": 0.02})
    loss = model(ebc(kjt)).sum(); loss.backward()     # embedding rows already updated
    opt = CombinedOptimizer([ebc.fused_optimizer, KeyedOptimizerWrapper(dense_params, make_adam)])

The batched modules live under ``_lookups`` (their per-table parameters are the very same objects
as ``embedding_bags.<table>.weight``); their own state_dict entries are dropped as duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, TypeVar

import torch
from torch import nn

from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.modules.collection_interfaces import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
)
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.modules.feature_checks import check_collection_input
from lightrec.modules.kernel_backend import resolve_kernel_backend
from lightrec.optim.fused_spec import FusedOptimizerSpec, optimizer_class_to_spec
from lightrec.optim.in_backward import fused_spec_from_parameter
from lightrec.optim.keyed import CombinedOptimizer
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from lightrec.sparse._ops import complete_cumsum

__all__ = ["FusedEmbeddingBagCollection", "FusedEmbeddingCollection"]


class _TableWeight(nn.Module):
    """Holds one table's weight so that its parameter is named ``<collection>.<table>.weight``."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

_Entry = TypeVar("_Entry")  # what a reset gives one table: (rows, weights) or (rows, seed, low, high)


def _resolve_spec(
    optimizer_type: type | None,
    optimizer_kwargs: Mapping[str, object] | None,
    fused_params: Mapping[str, object] | FusedOptimizerSpec | None,
) -> FusedOptimizerSpec:
    if (optimizer_type is None) == (fused_params is None):
        raise ValueError(
            "give exactly one of optimizer_type=torch.optim.X (with optimizer_kwargs) or fused_params={...}, "
            f"got optimizer_type={optimizer_type!r}, fused_params={fused_params!r}"
        )
    if optimizer_type is not None:
        return optimizer_class_to_spec(optimizer_type, optimizer_kwargs or {})
    spec = FusedOptimizerSpec.coerce(fused_params)
    assert spec is not None  # fused_params is not None here
    return spec


class _FusedCollectionBase(nn.Module):
    """Table bookkeeping, lookups, the state-dict de-duplication and the combined fused optimizer."""

    _attr: ClassVar[str]  # "embedding_bags" or "embeddings"
    _config_type: ClassVar[type[BaseEmbeddingConfig]]  # the tables it takes: EmbeddingBagConfig / EmbeddingConfig
    _lookups: nn.ModuleList  # of BatchedEmbeddingBag / BatchedEmbedding (see _lookup_modules)

    def __init__(self, tables: Sequence[BaseEmbeddingConfig], spec: FusedOptimizerSpec) -> None:
        super().__init__()
        for t in tables:
            if not isinstance(t, self._config_type):
                raise TypeError(
                    f"{type(self).__name__} takes {self._config_type.__name__} tables, got {type(t).__name__}"
                )
        names = [t.name for t in tables]
        if not tables or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"tables need unique, non-empty names, got {names}")
        features = [f for t in tables for f in t.feature_names]
        if len(set(features)) != len(features):
            raise ValueError(f"a feature may be read by only one table; got feature names {features}")
        if any(not t.feature_names for t in tables):
            raise ValueError(
                f"every table needs feature_names; tables without: {[t.name for t in tables if not t.feature_names]}"
            )
        self._tables = list(tables)
        self._spec = spec
        self._feature_names = features
        setattr(self, self._attr, nn.ModuleDict())
        # Registered after the table holders: nn.Module._apply visits children in order, and the
        # lookups must run last to re-point the shared parameters at their converted storage.
        self._lookups = nn.ModuleList()
        self._pending: dict[str, nn.Parameter] = {}
        self._register_state_dict_hook(_drop_lookup_entries)
        self._register_load_state_dict_pre_hook(_fill_lookup_entries, with_module=True)

    def _add_lookup(
        self, lookup: BatchedEmbeddingBag | BatchedEmbedding, tables: Sequence[BaseEmbeddingConfig]
    ) -> None:
        self._lookups.append(lookup)
        self._pending.update(
            {t.name: w for t, w in zip(tables, lookup.split_embedding_weights(), strict=True)}
        )
        if len(self._pending) == len(self._tables):  # all lookups built: expose weights in table order
            holder = getattr(self, self._attr)
            for t in self._tables:
                holder[t.name] = _TableWeight(self._pending[t.name])
            self._pending.clear()

    def _param_names(self, tables: Sequence[BaseEmbeddingConfig]) -> list[str]:
        return [f"{self._attr}.{t.name}.weight" for t in tables]

    def _lookup_modules(self) -> list[BatchedEmbeddingBag | BatchedEmbedding]:
        return [lk for lk in self._lookups if isinstance(lk, (BatchedEmbeddingBag, BatchedEmbedding))]

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """All lookups' fused optimizers as one ``CombinedOptimizer`` (state keyed by parameter name)."""
        return CombinedOptimizer([("", lk.fused_optimizer) for lk in self._lookup_modules()])

    def feature_names(self) -> list[str]:
        return list(self._feature_names)

    def reset_embedding_rows(self, table: str, rows: torch.Tensor, values: torch.Tensor) -> None:
        """Give ``rows`` of ``table`` the weights ``values`` ``[k, D]`` and a fresh optimizer state
        (managed-collision evictions; the kernels' ``reset_rows``, ``lightrec.kernels.kernel_interface``)."""
        for lookup in self._lookup_modules():
            if table in lookup.table_names:
                lookup.reset_rows(table, rows, values)
                return
        raise KeyError(f"{type(self).__name__} has no table {table!r}; its tables are {[t.name for t in self._tables]}")

    def reset_embedding_rows_of_tables(self, resets: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """:meth:`reset_embedding_rows` of several tables (``{table: (rows, values)}``), one kernel call
        per lookup module (a managed-collision step resets rows of every table)."""
        self._per_lookup(resets, lambda lookup, mine: lookup.reset_rows_of_tables(mine))

    def reset_embedding_rows_uniform(self, resets: dict[str, tuple[torch.Tensor, int, float, float]]) -> None:
        """:meth:`reset_embedding_rows_of_tables` with the fresh values drawn by the kernels
        (``{table: (rows, seed, low, high)}``; ``BatchedEmbeddingBag.reset_rows_uniform_of_tables``)."""
        self._per_lookup(resets, lambda lookup, mine: lookup.reset_rows_uniform_of_tables(mine))

    def _per_lookup(
        self, resets: Mapping[str, _Entry], call: Callable[[BatchedEmbeddingBag | BatchedEmbedding, dict[str, _Entry]], None]
    ) -> None:
        """``call(lookup, {table: entry})`` once per lookup module holding tables of ``resets``."""
        left = dict(resets)
        for lookup in self._lookup_modules():
            mine = {t: left.pop(t) for t in lookup.table_names if t in left}
            if mine:
                call(lookup, mine)
        if left:
            raise KeyError(f"{type(self).__name__} has no table {sorted(left)[0]!r}; its tables are "
                           f"{[t.name for t in self._tables]}")  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self._lookup_modules()[0].split_embedding_weights()[0].device


def _drop_lookup_entries(
    module: nn.Module, state_dict: dict[str, object], prefix: str, local_metadata: dict[str, object]
) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "_lookups.")]:
        del state_dict[key]


def _fill_lookup_entries(
    module: _FusedCollectionBase, state_dict: dict[str, object], prefix: str, *args: object
) -> None:
    # The lookups' parameters are the table weights themselves; feed them the same entries so a
    # state_dict without "_lookups.*" keys loads strictly.
    for i, lookup in enumerate(module._lookup_modules()):
        for name in lookup.table_names:
            src = f"{prefix}{module._attr}.{name}.weight"
            if src in state_dict:
                state_dict.setdefault(f"{prefix}_lookups.{i}.weights.{name}", state_dict[src])


class FusedEmbeddingBagCollection(_FusedCollectionBase, EmbeddingBagCollectionInterface):
    """Pooled tables with a fused (in-backward) optimizer, on one process.

    Args:
        tables: one ``EmbeddingBagConfig`` per table (SUM and MEAN may be mixed: one kernel call per
            pooling type).
        optimizer_type / optimizer_kwargs: e.g. ``torch.optim.Adagrad, {"lr": 0.1}`` (see
            ``lightrec.optim.optimizer_class_to_spec`` for what maps to a fused optimizer), or
        fused_params: torchrec-style ``{"optimizer": EmbOptimType..., "learning_rate": ...}`` or a
            ``FusedOptimizerSpec``.
        is_weighted: pool with the KJT's per-id weights.
        device: where the tables live.
        kernel_backend: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"`` (see ``BatchedEmbeddingBag``).
        backend: the former name of ``kernel_backend`` (deprecated).
        id_check: ``"auto"``, ``"sync"`` or ``"async"`` (see ``BatchedEmbeddingBag``).
        tiering: keep every table's rows in host memory or on SSD with a cache of hot rows on
            ``device`` (``TieringConfig``; docs/tiered-tables.md).
    """

    _attr = "embedding_bags"
    _config_type = EmbeddingBagConfig
    _out_perm: torch.Tensor | None  # buffer: column permutation from lookup order to table order

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        optimizer_type: type | None = None,
        optimizer_kwargs: Mapping[str, object] | None = None,
        *,
        fused_params: Mapping[str, object] | FusedOptimizerSpec | None = None,
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        kernel_backend: str = "auto",
        id_check: str = "auto",
        tiering: TieringConfig | None = None,
        backend: str | None = None,
    ) -> None:
        kernel_backend = resolve_kernel_backend(kernel_backend, "FusedEmbeddingBagCollection", backend=backend)
        super().__init__(tables, _resolve_spec(optimizer_type, optimizer_kwargs, fused_params))
        self._is_weighted = is_weighted
        # One batched module per pooling type, in order of first appearance.
        self._group_features: list[list[str]] = []
        for pooling in dict.fromkeys(t.pooling for t in tables):
            group = [t for t in tables if t.pooling == pooling]
            ftm = [i for i, t in enumerate(group) for _ in t.feature_names]
            lookup = BatchedEmbeddingBag(
                group,
                ftm,
                pooling,
                self._spec,
                kernel_backend,
                device,
                optimizer_param_names=self._param_names(group),
                id_check=id_check,
                tiering=tiering,
            )
            self._add_lookup(lookup, group)
            self._group_features.append([f for t in group for f in t.feature_names])
        self._lookup_order = [f for g in self._group_features for f in g]
        self._dims = {f: t.embedding_dim for t in tables for f in t.feature_names}
        # Column permutation from lookup order back to table order (None when already in order).
        # A buffer, so it moves with the module: copying it to the device at every call would be a
        # host-to-device copy (and a stall) per step.
        out_perm: torch.Tensor | None = None
        if self._lookup_order != self._feature_names:
            starts, col = {}, 0
            for f in self._lookup_order:
                starts[f], col = col, col + self._dims[f]
            out_perm = torch.cat(
                [torch.arange(starts[f], starts[f] + self._dims[f]) for f in self._feature_names]
            ).to(self.device)
        self.register_buffer("_out_perm", out_perm, persistent=False)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return [t for t in self._tables if isinstance(t, EmbeddingBagConfig)]  # all are (checked in __init__)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every feature; returns ``KeyedTensor(keys=feature_names(), values=[B, sum D])``."""
        check_collection_input(features, self._feature_names, "FusedEmbeddingBagCollection", weighted=self._is_weighted)
        kjt = features.permute_to_keys(self._lookup_order)
        weights = kjt.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ValueError(
                "FusedEmbeddingBagCollection(is_weighted=True) needs a KeyedJaggedTensor with weights"
            )
        batch, lengths, values = kjt.stride(), kjt.lengths(), kjt.values()
        # With one lookup group its ids are all of values: no per-key sizes (a host sync when the
        # KJT does not carry them) are needed.
        offset_per_key = None if len(self._lookups) == 1 else kjt.offset_per_key()
        outs, first = [], 0
        for lookup, group in zip(self._lookups, self._group_features, strict=True):
            last = first + len(group)
            lo, hi = (
                (0, values.numel())
                if offset_per_key is None
                else (offset_per_key[first], offset_per_key[last])
            )
            group_lengths = lengths[first * batch : last * batch]
            offsets = complete_cumsum(group_lengths.long())
            outs.append(lookup(values[lo:hi], offsets, weights[lo:hi] if weights is not None else None))
            first = last
        pooled = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._out_perm is not None:
            pooled = pooled.index_select(1, self._out_perm)
        return KeyedTensor(
            keys=list(self._feature_names),
            length_per_key=[self._dims[f] for f in self._feature_names],
            values=pooled,
            key_dim=1,
        )

    @classmethod
    def from_module(
        cls,
        module: EmbeddingBagCollection,
        fused_params: Mapping[str, object] | FusedOptimizerSpec | None = None,
        kernel_backend: str = "auto",
        *,
        backend: str | None = None,
    ) -> FusedEmbeddingBagCollection:
        """Fused twin of an ``EmbeddingBagCollection`` (same tables, weights copied).

        The optimizer is ``fused_params`` if given, else the one ``apply_optimizer_in_backward``
        marked on the module's table weights (all tables must carry the same one).

        Raises:
            ValueError: no optimizer given and the weights are unmarked, or marked differently.
        """
        configs = module.embedding_bag_configs()
        spec = FusedOptimizerSpec.coerce(fused_params)
        if spec is None:
            specs = {name: fused_spec_from_parameter(p) for name, p in module.named_parameters()}
            if None in specs.values() or len(set(map(repr, specs.values()))) != 1:
                raise ValueError(
                    "from_module needs fused_params=... or every table weight marked with the same "
                    f"apply_optimizer_in_backward optimizer; found {specs}"
                )
            spec = next(iter(specs.values()))
        device = next(module.parameters()).device
        kernel_backend = resolve_kernel_backend(kernel_backend, "FusedEmbeddingBagCollection.from_module", backend=backend)
        fused = cls(
            configs, fused_params=spec, is_weighted=module.is_weighted(), device=device, kernel_backend=kernel_backend
        )
        fused.load_state_dict(module.state_dict())
        return fused

    def extra_repr(self) -> str:
        return f"is_weighted={self._is_weighted}"


class FusedEmbeddingCollection(_FusedCollectionBase, EmbeddingCollectionInterface):
    """Unpooled tables with a fused optimizer: ``KeyedJaggedTensor`` -> ``{feature: JaggedTensor}``.

    All tables must share one ``embedding_dim`` (one kernel call). Arguments as
    :class:`FusedEmbeddingBagCollection` (no ``is_weighted``); ``state_dict`` keys are
    ``embeddings.<table>.weight`` like ``EmbeddingCollection``.
    """

    _attr = "embeddings"
    _config_type = EmbeddingConfig

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        optimizer_type: type | None = None,
        optimizer_kwargs: Mapping[str, object] | None = None,
        *,
        fused_params: Mapping[str, object] | FusedOptimizerSpec | None = None,
        device: torch.device | str | None = None,
        kernel_backend: str = "auto",
        id_check: str = "auto",
        tiering: TieringConfig | None = None,
        backend: str | None = None,
    ) -> None:
        kernel_backend = resolve_kernel_backend(kernel_backend, "FusedEmbeddingCollection", backend=backend)
        super().__init__(tables, _resolve_spec(optimizer_type, optimizer_kwargs, fused_params))
        ftm = [i for i, t in enumerate(tables) for _ in t.feature_names]
        lookup = BatchedEmbedding(
            tables, ftm, self._spec, kernel_backend, device, self._param_names(tables), id_check=id_check,
            tiering=tiering,
        )  # fmt: skip
        self._add_lookup(lookup, tables)

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return [t for t in self._tables if isinstance(t, EmbeddingConfig)]  # all are (checked in __init__)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Look up every id; ``{feature: JaggedTensor(values [N_f, D], lengths [B])}``."""
        check_collection_input(features, self._feature_names, "FusedEmbeddingCollection")
        kjt = features.permute_to_keys(self._feature_names)
        lengths = kjt.lengths()
        offsets = complete_cumsum(lengths.long())
        rows = self._lookups[0](kjt.values(), offsets)
        batch, opk = kjt.stride(), kjt.offset_per_key()
        return {
            f: JaggedTensor(values=rows[opk[i] : opk[i + 1]], lengths=lengths[i * batch : (i + 1) * batch])
            for i, f in enumerate(self._feature_names)
        }
