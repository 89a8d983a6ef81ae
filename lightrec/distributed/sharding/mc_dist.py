"""Input side of sharded managed-collision tables: raw ids checked, hashed and routed to their owner.

A managed-collision table splits its raw id space into ``B`` buckets and its rows into ``B``
segments (``lightrec.modules.managed_collision.ops``). Sharded row-wise, rank ``r`` holds the rows of buckets
``[r * B / W, (r + 1) * B / W)``, so an id's owner is ``bucket(id) // (B / W)``. The input dist
sends every *raw* id to its owner, which remaps it to one of its rows (the lookups of
``mc_lookups.py``); table-wise tables send all ids to the table's rank as usual.

:class:`McRoutes` holds, per table, a ``meta`` twin of its managed-collision module (no memory): the
routing needs only the module's id space, buckets and ``input_hash_func``, on every rank --
including ranks that hold none of the table's rows.
"""

from __future__ import annotations

import torch
from torch import nn

from lightrec.distributed.comm import KJTAllToAll, bucketize_kjt_by_rank
from lightrec.distributed.sharding.common import DistContext, KeySelector, mean_weights
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["McRoutes", "McRwSparseFeaturesDist"]


class McRoutes:
    """Per table: its features and a ``meta`` twin of its module (see the module docstring).

    Args:
        modules: ``{table: the unsharded ManagedCollisionModule}``.
        table_features: ``{table: feature names}``.
        need_preprocess: apply each module's ``input_hash_func`` (``ManagedCollisionCollection.need_preprocess``).
    """

    def __init__(
        self, modules: dict[str, ManagedCollisionModule], table_features: dict[str, list[str]], need_preprocess: bool
    ) -> None:
        self.table_features = {t: list(f) for t, f in table_features.items()}
        self.feature_table = {f: t for t, fs in self.table_features.items() for f in fs}
        self.need_preprocess = need_preprocess
        self.twins: dict[str, ManagedCollisionModule] = {}
        for table, module in modules.items():
            segments = list(getattr(module, "output_segments", [0, module.output_size()]))
            twin = module.rebuild_with_output_id_range((segments[0], segments[1]), segments, torch.device("meta"))
            twin._name = module._name or table
            self.twins[table] = twin

    def prepare(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Hash (``input_hash_func``) and check the raw ids of every managed feature of ``kjt``.

        Raises:
            ManagedCollisionIdError: an id outside its table's id space (names the table).
        """
        values = kjt.values()
        offsets = kjt.offset_per_key()
        parts: list[torch.Tensor] = []
        changed = False
        for i, key in enumerate(kjt.keys()):
            ids = values[offsets[i] : offsets[i + 1]]
            table = self.feature_table.get(key)
            if table is not None:
                twin = self.twins[table]
                if self.need_preprocess:
                    as_long = ids.long()
                    hashed = twin.preprocess_values(as_long)
                    changed = changed or hashed is not as_long
                    ids = hashed
                twin.check_ids(ids, [key])
            parts.append(ids.to(values.dtype) if ids.dtype != values.dtype else ids)
        if not changed:
            return kjt
        return KeyedJaggedTensor(
            kjt.keys(), torch.cat(parts) if parts else values, kjt.weights_or_none(), lengths=kjt.lengths(),
            stride=kjt.stride(), length_per_key=kjt.length_per_key(), offset_per_key=offsets,
        )  # fmt: skip

    def owner(self, table: str, ids: torch.Tensor, buckets_per_rank: int) -> torch.Tensor:
        """``[N]`` rank owning each raw id of ``table`` (row-wise: whole buckets per rank)."""
        return torch.div(self.twins[table].bucket_of(ids.long()), buckets_per_rank, rounding_mode="floor")


class McRwSparseFeaturesDist(nn.Module):
    """Row-wise input dist of managed-collision tables: select the features, add MEAN factors,
    send every raw id to the rank owning its bucket (values unchanged), KJT all-to-all.

    Args:
        pg / world_size: the process group and its size.
        feature_indices: collection feature index of each row-wise feature (in sharding order).
        tables: the table of each of those features.
        routes: the tables' :class:`McRoutes`.
        buckets_per_rank: ``{table: B / W}``.
        mean_keys: ``[T]`` MEAN flags.
        keep_weights: the collection is weighted.
        sequence: compute the unbucketize permutation (sequence tables, or remapped ids returned).
    """

    def __init__(
        self,
        pg: torch.distributed.ProcessGroup | None,
        world_size: int,
        feature_indices: list[int],
        tables: list[str],
        routes: McRoutes,
        buckets_per_rank: dict[str, int],
        mean_keys: list[bool],
        keep_weights: bool,
        sequence: bool,
    ) -> None:
        super().__init__()
        self._select = KeySelector(feature_indices, keep_weights)
        self._world_size = world_size
        self._tables = list(tables)
        self._routes = routes
        self._buckets_per_rank = dict(buckets_per_rank)
        self._has_mean = any(mean_keys)
        self._mean_mask = None if all(mean_keys) else torch.tensor(mean_keys, dtype=torch.bool)
        self._sequence = sequence
        self._dist = KJTAllToAll(pg, [len(feature_indices)] * world_size)

    def forward(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> DistContext:
        sent = self._select(kjt, positions)
        values = sent.values()
        if self._has_mean:
            lengths = sent.lengths()
            mask = None if self._mean_mask is None else self._mean_mask.to(lengths.device)
            w = mean_weights(lengths, values.numel(), mask, sent.stride(), sent.weights_or_none())
            sent = KeyedJaggedTensor(sent.keys(), values, w, lengths=lengths, stride=sent.stride())
        offsets = sent.offset_per_key()
        ranks = [
            self._routes.owner(table, values[offsets[k] : offsets[k + 1]], self._buckets_per_rank[table])
            for k, table in enumerate(self._tables)
        ]
        rank = torch.cat(ranks) if ranks else values.new_zeros(0, dtype=torch.int64)
        bucketized = bucketize_kjt_by_rank(sent, rank, self._world_size, output_permute=self._sequence)
        return DistContext(sent, self._dist(bucketized.kjt), bucketized.unbucketize_permute)

    def extra_repr(self) -> str:
        return f"tables={self._tables}, world_size={self._world_size}"
