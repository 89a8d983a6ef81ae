"""``ManagedCollisionCollection``: one managed-collision module per table, applied to a whole KJT.

::

    mcc = ManagedCollisionCollection(
        managed_collision_modules={"t_user": MCHManagedCollisionModule(zch_size=100_000, device="cpu",
                                   eviction_policy=LRU_EvictionPolicy(), eviction_interval=10)},
        embedding_configs=[EmbeddingBagConfig(num_embeddings=100_000, embedding_dim=64, name="t_user",
                                              feature_names=["user_id"])],
    )
    remapped = mcc(kjt)         # same keys and lengths; raw 64-bit ids -> rows of each table

The ids of all features of a table go through its module together (one step per table and
forward). Every module's ``output_size()`` must equal its table's ``num_embeddings``; raw ids must
lie in ``[0, input_hash_size)``; errors name the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.feature_checks import check_feature_keys, features_of_several_tables
from lightrec.modules.managed_collision.base import ManagedCollisionModule, ids_in_range
from lightrec.modules.managed_collision.ops import int64_ids
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["ManagedCollisionCollection", "apply_mc_method_to_jt_dict", "check_mc_tables"]


@torch.fx.wrap
def apply_mc_method_to_jt_dict(
    mc_module: nn.Module, method: str, features_dict: dict[str, JaggedTensor]
) -> dict[str, JaggedTensor]:
    """``getattr(mc_module, method)(features_dict)`` as one fx node (torchrec's helper)."""
    result: dict[str, JaggedTensor] = getattr(mc_module, method)(features_dict)
    return result


def check_mc_tables(
    modules: dict[str, ManagedCollisionModule], configs: Sequence[BaseEmbeddingConfig], where: str
) -> None:
    """Every table has a module whose output size is its ``num_embeddings``; no extra modules.

    Raises:
        ValueError / TypeError: naming the table and what to change.
    """
    names = [c.name for c in configs]
    for c in configs:
        module = modules.get(c.name)
        if module is None:
            raise ValueError(
                f"{where}: table {c.name!r} has no managed-collision module; managed_collision_modules must have "
                f"one per table (tables: {names}, modules: {sorted(modules)})"
            )
        if not isinstance(module, ManagedCollisionModule):
            raise TypeError(f"{where}: the module of table {c.name!r} is a {type(module).__name__}, not a ManagedCollisionModule")
        if module.output_size() != c.num_embeddings:
            raise ValueError(
                f"{where}: the managed-collision module of table {c.name!r} maps to {module.output_size()} rows "
                f"(zch_size) but the table has num_embeddings={c.num_embeddings}; give both the same size"
            )
    extra = sorted(set(modules) - set(names))
    if extra:
        raise ValueError(f"{where}: managed_collision_modules names tables {extra} that are not in embedding_configs {names}")
    shared = features_of_several_tables([list(c.feature_names) for c in configs])
    if shared:
        raise ValueError(
            f"{where}: features {shared} are read by several tables; a managed-collision table owns its features "
            "(copy the KJT key under another name for the second table)"
        )


class ManagedCollisionCollection(nn.Module):
    """Managed-collision modules of several tables (see the module docstring).

    Args:
        managed_collision_modules: ``{table name: ManagedCollisionModule}``, one per table.
        embedding_configs: the tables (``EmbeddingBagConfig`` or ``EmbeddingConfig``).
        need_preprocess: apply each module's ``input_hash_func`` (torchrec's flag).
    """

    def __init__(
        self,
        managed_collision_modules: dict[str, ManagedCollisionModule],
        embedding_configs: Sequence[BaseEmbeddingConfig],
        need_preprocess: bool = True,
    ) -> None:
        super().__init__()
        check_mc_tables(dict(managed_collision_modules), embedding_configs, "ManagedCollisionCollection")
        self._embedding_configs = list(embedding_configs)
        self.need_preprocess = need_preprocess
        for c in self._embedding_configs:
            managed_collision_modules[c.name]._name = c.name  # messages name the table the module serves
        self._managed_collision_modules = nn.ModuleDict(
            {c.name: managed_collision_modules[c.name] for c in self._embedding_configs}
        )
        self._feature_to_table = {f: c.name for c in self._embedding_configs for f in c.feature_names}
        self._table_to_features = {c.name: list(c.feature_names) for c in self._embedding_configs}
        self._feature_names = [f for c in self._embedding_configs for f in c.feature_names]

    def embedding_configs(self) -> list[BaseEmbeddingConfig]:
        return list(self._embedding_configs)

    def feature_names(self) -> list[str]:
        return list(self._feature_names)

    def modules_by_table(self) -> dict[str, ManagedCollisionModule]:
        return {name: m for name, m in self._managed_collision_modules.items() if isinstance(m, ManagedCollisionModule)}

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Remap every table's raw ids to its rows.

        Args:
            features: a KJT holding at least the tables' features (other keys are dropped); ids
                int64, int32 or uint64 (read as their int64 bits: above ``2**63 - 1`` they are
                negative, outside the id space, and folded into it as any such id).

        Returns:
            A KJT with keys ``feature_names()`` (table order), the same lengths and weights, and
            int64 row ids as values.
        """
        check_feature_keys(features.keys(), self._feature_names, "ManagedCollisionCollection")
        kjt = features.permute_to_keys(self._feature_names)
        values = int64_ids(kjt.values())  # (uint64 ids: their bits, which the range checks then fold)
        offsets = kjt.offset_per_key()
        out: list[torch.Tensor] = []
        first = 0
        modules = self.modules_by_table()
        checked = self._ids_checked_at_once(values, modules)
        for table, module in modules.items():
            names = self._table_to_features[table]
            ids = values[offsets[first] : offsets[first + len(names)]]
            if self.need_preprocess:
                ids = module.preprocess_values(ids)
            if not checked:
                ids = module.admit_ids(ids, names)
            splits = [offsets[first + i + 1] - offsets[first + i] for i in range(len(names))]
            out.append(module.remap_values(ids, splits))
            first += len(names)
        remapped = torch.cat(out) if out else values
        return KeyedJaggedTensor(
            keys=self._feature_names, values=remapped, weights=kjt.weights_or_none(), lengths=kjt.lengths(),
            stride=kjt.stride(), length_per_key=kjt.length_per_key(), offset_per_key=offsets,
        )  # fmt: skip

    def _ids_checked_at_once(self, values: torch.Tensor, modules: dict[str, ManagedCollisionModule]) -> bool:
        """Whether one range check of all the ids showed them fine for every table: the tables share
        one id space and leave ids as they are (else, or when an id is bad, each table checks its own
        ids, and the error names the table)."""
        limits = {m.input_size() for m in modules.values()}
        if len(limits) != 1 or values.numel() == 0:
            return False
        if self.need_preprocess and not all(m.preprocess_is_identity() for m in modules.values()):
            return False
        return ids_in_range(values, limits.pop())

    def evict(self) -> dict[str, torch.Tensor | None]:
        """``{table: rows evicted since the last call (None: none)}``."""
        return {table: module.evict() for table, module in self.modules_by_table().items()}

    def open_slots(self) -> dict[str, torch.Tensor]:
        return {table: module.open_slots() for table, module in self.modules_by_table().items()}
