"""``QuantEmbeddingBagCollection``: an ``EmbeddingBagCollection`` whose tables are stored quantized.

Same call shape and output as the float collection (``KeyedJaggedTensor`` → ``KeyedTensor``
``[B, sum D]`` float32), with every table kept as a ``uint8`` buffer in fbgemm's row layout
(:mod:`lightrec.quant.row_codec`) under the same name the float weight had::

    embedding_bags.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

Those buffers are views of one flat buffer holding every table back to back (``_flat_weights``,
not in the state dict), so that tables pooling the same way are looked up with **one** fbgemm IntN
call (:mod:`lightrec.quant.table_groups`) when fbgemm imports, otherwise with a pure-torch
kernel with bit-identical results (:mod:`lightrec.quant.pooled_kernels`). Build one with :meth:`from_float`, with
:func:`lightrec.inference.quantize`, or with torch's ``quantize_dynamic`` (the TorchRec tutorial's way).
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code,
# and TorchScript must see real classes there, not strings.

from typing import Any, List, Optional

import torch
from torch import nn

from lightrec._compat import is_fx_symbolic_tracing as is_fx_tracing
from lightrec._host_memory import allocate_host_buffer
from lightrec.modules.collection_interfaces import EmbeddingBagCollectionInterface
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from lightrec.modules.embedding_modules import embedding_names_by_table, ids_per_table
from lightrec.modules.feature_checks import check_collection_input
from lightrec.quant.collection_base import CACHE_FEATURES_ORDER_ATTR, QuantCollectionBase, QuantTable
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.managed_collision import (  # torchrec's path for them (re-exported)
    QuantManagedCollisionEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingCollection,
)
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT, row_size_in_bytes, sparse_type_code
from lightrec.quant.table_groups import (
    StoredTableLayout,
    check_ids_by_table,
    equal_rows_runs,
    make_table_groups,
)
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "QuantEmbeddingBagCollection",
    "QuantEmbeddingCollection",
    "QuantManagedCollisionEmbeddingBagCollection",
    "QuantManagedCollisionEmbeddingCollection",
    "quant_prep_enable_cache_features_order",
]

# one graph node under torch.fx (torch.fx.wrap patches the calling module's globals, i.e. this one's)
torch.fx.wrap("check_ids_by_table")


class QuantEmbeddingBagCollection(QuantCollectionBase, EmbeddingBagCollectionInterface):
    """Pooled embedding tables stored as int8 / int4 / fp16 rows, looked up in float32.

    Args:
        tables: the float collection's ``EmbeddingBagConfig`` list.
        is_weighted: use the KJT's per-id weights.
        device: where the stored tables live.
        dtype: storage type of every table (``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"``,
            ``torch.float16``/``"fp16"`` or a ``DataType``).
        per_table: ``{table name: dtype}`` overrides.
        row_alignment: stored rows are padded to a multiple of this many bytes (16, like torchrec).
        bounds_check: ``"error"`` (default), ``"clamp"`` or ``"skip"`` for ids outside a table.
        kernel_backend: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"`` lookups (see
            :func:`~lightrec.quant.collection_base.resolve_quant_kernel`); ``kernel`` says which runs.
        use_fbgemm, backend: deprecated spellings of ``kernel_backend`` (``use_fbgemm=True``:
            ``"fbgemm"``, ``False``: ``"torch"``; see ``lightrec.modules.kernel_backend``).

    The tables are zero until filled: use :meth:`from_float`, :meth:`set_float_weight`, or
    ``load_state_dict`` with a state dict of this module.
    """

    TABLES_ATTR = "embedding_bags"
    FLOAT_CONFIGS = "embedding_bag_configs"
    CONFIG_TYPE = EmbeddingBagConfig
    _flat_weights: torch.Tensor  # every stored table back to back (buffer; the tables are views)

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        dtype: object = DataType.INT8,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        bounds_check: str = "error",
        kernel_backend: str = "auto",
        *,
        use_fbgemm: bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(tables, device, dtype, per_table, row_alignment, bounds_check, kernel_backend,
                         use_fbgemm, backend)
        data_types = [t.data_type for t in self._configs]
        self._is_weighted = is_weighted
        # All tables live back to back in one flat buffer (lightrec.quant.table_groups), so a
        # group of tables is one fbgemm call; embedding_bags.<t>.weight are views of it (the state
        # dict keys), and the flat buffer itself is not saved.
        specs: list[StoredTableLayout] = []
        start = 0
        for t, dt in zip(tables, data_types):
            row_bytes = row_size_in_bytes(t.embedding_dim, dt, row_alignment)
            specs.append(StoredTableLayout(start, t.num_embeddings, row_bytes, t.embedding_dim, sparse_type_code(dt),
                                           len(t.feature_names), t.pooling == PoolingType.MEAN))
            start += t.num_embeddings * row_bytes
        self._specs = specs
        self.register_buffer("_flat_weights", allocate_host_buffer(start, device), persistent=False)
        self.embedding_bags = nn.ModuleDict()
        for t, spec in zip(tables, specs):
            self.embedding_bags[t.name] = QuantTable(spec.rows, spec.row_bytes, storage=self._table_view(spec))
        self._groups = make_table_groups(specs, self.kernel, row_alignment, torch.device(device) if device else None)
        self.register_load_state_dict_post_hook(QuantEmbeddingBagCollection._restore_views)
        self._embedding_names: List[str] = [n for names in embedding_names_by_table(tables) for n in names]
        self._lengths_per_embedding: List[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._table_mean: List[bool] = [t.pooling == PoolingType.MEAN for t in tables]
        self._equal_rows_runs: List[int] = equal_rows_runs(self._table_rows)
        self._table_feature_offsets: List[int] = [0]  # [T + 1] index of each table's first feature
        for t in tables:
            self._table_feature_offsets.append(self._table_feature_offsets[-1] + len(t.feature_names))

    @classmethod
    def _float_options(cls, module: nn.Module) -> dict[str, Any]:
        is_weighted = getattr(module, "is_weighted", None)
        return {"is_weighted": is_weighted() if callable(is_weighted) else False}

    # ------------------------------------------------------------------ introspection
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    # ------------------------------------------------------------------ lookup
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every feature's ids (same contract as ``EmbeddingBagCollection.forward``).

        Returns:
            ``KeyedTensor`` with keys ``feature_names()`` and float32 values ``[B, sum D]``.
        """
        weights: Optional[torch.Tensor] = None
        if self._bounds_check == "error":
            # ids are looked up as they come: check them with one min/max per run of equal-sized tables
            if not torch.jit.is_scripting():  # TorchScript skips this branch; it cannot compile set logic
                if not is_fx_tracing():
                    check_collection_input(
                        features, self._feature_order, "QuantEmbeddingBagCollection", weighted=self._is_weighted
                    )
                    if self._is_weighted and features.weights_or_none() is None:
                        raise ValueError(
                            "QuantEmbeddingBagCollection(is_weighted=True) needs per-id weights, but the "
                            "KeyedJaggedTensor has weights=None; pass weights=... or quantize an unweighted collection"
                        )
            features = self._in_feature_order(features)
            stride = features.stride()
            offset_per_key = features.offset_per_key()
            lengths = features.lengths()
            if self._is_weighted:
                weights = features.weights()  # weights() (a Tensor, not Optional) keeps a traced graph scriptable
            value_offsets: List[int] = [offset_per_key[f] for f in self._table_feature_offsets]
            values = check_ids_by_table(features.values(), lengths, value_offsets, self._table_feature_offsets,
                                        self._table_rows, self._table_names, self._table_features, stride,
                                        self._equal_rows_runs)
        else:  # "clamp" / "skip" change ids (and lengths): the shared per-table path, then one run again
            stride, slices = ids_per_table(
                features, self._feature_order, self._table_names, self._table_features, self._table_rows,
                self._is_weighted, self._bounds_check, "QuantEmbeddingBagCollection",
            )  # fmt: skip
            values = torch.cat([s[0] for s in slices])
            lengths = torch.cat([s[1] for s in slices])
            if self._is_weighted:
                parts: List[torch.Tensor] = []
                for s in slices:
                    w = s[2]
                    if w is not None:
                        parts.append(w)
                weights = torch.cat(parts)
            value_offsets = [0]
            for s in slices:
                value_offsets.append(value_offsets[-1] + s[0].numel())
        pooled: List[torch.Tensor] = []
        for group in self._groups:
            pooled.append(group(self._flat_weights, values, lengths, weights, value_offsets, stride))
        return KeyedTensor(
            keys=self._embedding_names,
            length_per_key=self._lengths_per_embedding,
            values=pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1),
            key_dim=1,
        )

    # ------------------------------------------------------------------ storage
    def _table_view(self, spec: StoredTableLayout) -> torch.Tensor:
        flat = self._flat_weights
        return flat[spec.byte_offset : spec.byte_offset + spec.rows * spec.row_bytes].view(spec.rows, spec.row_bytes)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        # .to() / .cpu() / .cuda() / share_memory(): convert the flat buffer once and re-point the
        # per-table views at it. Converting each view on its own would copy every table and cut it
        # off from the buffer the lookups read.
        # The groups' constants are rebuilt, not converted: to_empty() would leave them garbage.
        self._buffers["_flat_weights"] = fn(self._flat_weights)
        for group in self._groups:
            reset = getattr(group, "reset_constants", None)
            if reset is not None:
                reset(self._flat_weights.device)
        for name, spec in zip(self._table_names, self._specs):
            self.embedding_bags[name]._buffers["weight"] = self._table_view(spec)
        return self

    @staticmethod
    def _restore_views(module: "QuantEmbeddingBagCollection", incompatible_keys: object) -> None:
        # load_state_dict(assign=True) replaces the per-table buffers by the loaded tensors: copy
        # them into the flat buffer the lookups read and make the tables views again.
        for name, spec in zip(module._table_names, module._specs):
            holder = module._stored_tables()[name]
            view = module._table_view(spec)
            if holder.weight.data_ptr() != view.data_ptr():
                view.copy_(holder.weight)
                holder._buffers["weight"] = view

    def extra_repr(self) -> str:
        return f"{self._repr_settings()}, is_weighted={self._is_weighted}"


def quant_prep_enable_cache_features_order(module: nn.Module, module_types: list[type[nn.Module]]) -> None:
    """Mark every submodule of ``module`` (itself included) of one of ``module_types`` so that its
    quantized form caches the order of the input's keys (torchrec's inference preparation).

    Call it on the float model before quantizing: ``from_float`` (and so ``quantize`` /
    ``quantize_embeddings``) gives each marked collection ``cache_features_order=True``. The first
    batch then fixes how the KJT's keys map to the tables' features, and later batches with the same
    keys reuse that permutation instead of building it again (a batch with other keys builds a new
    one, so the cache is never wrong).
    """
    types = tuple(module_types)
    for m in module.modules():
        if isinstance(m, types):
            setattr(m, CACHE_FEATURES_ORDER_ATTR, True)  # a plain attribute of any module type, as torchrec's


# torchrec's names (``torchrec.quant.embedding_modules.EmbeddingBagCollection`` is the quantized EBC)
EmbeddingBagCollection = QuantEmbeddingBagCollection
EmbeddingCollection = QuantEmbeddingCollection
