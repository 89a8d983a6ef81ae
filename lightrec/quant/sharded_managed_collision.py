"""Inference sharding of a quantized managed-collision ``EmbeddingCollection``: the sequence tables
spread table-wise over serving devices, the frozen id maps kept whole in front of them::

    KJT raw ids --frozen remappers (output device)--> rows --split per device group--> .to(group device)
      --QuantEmbeddingCollection of the group--> {feature: rows} --.to(output device)--> merged dict

Outputs equal the unsharded quantized module's (the same stored rows, the same lookup arithmetic).
``lightrec.distributed.quant_embedding.QuantManagedCollisionEmbeddingCollectionSharder`` is the
torchrec-named entry point; pooled managed-collision collections need no own sharder: their inner
quantized bag collection is spread by ``shard_for_inference`` like any other.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code.

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from lightrec.modules.embedding_configs import EmbeddingConfig
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.managed_collision import QuantManagedCollisionEmbeddingCollection
from lightrec.quant.sharded_embedding_bag import assign_tables_by_size
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["ShardedQuantManagedCollisionEmbeddingCollection", "shard_managed_collection_for_inference"]


class ShardedQuantManagedCollisionEmbeddingCollection(nn.Module):
    """A ``QuantManagedCollisionEmbeddingCollection`` with its tables over ``devices`` (module docstring).

    Args:
        module: the quantized managed-collision collection (its stored rows are copied).
        devices: serving devices; table ``i`` goes to ``devices[assignment[i]]``.
        assignment: device index per table (``embedding_configs()`` order).
        output_device: where the remappers run and the rows are gathered (default ``devices[0]``).
    """

    def __init__(
        self,
        module: QuantManagedCollisionEmbeddingCollection,
        devices: List[torch.device],
        assignment: List[int],
        output_device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        source = module._embedding_module
        configs: List[EmbeddingConfig] = source.embedding_configs()
        out = output_device if output_device is not None else devices[0]
        self._managed_collision_collection = module._managed_collision_collection.to(out)
        self._return_remapped_features = module._return_remapped_features
        self.groups = nn.ModuleList()
        self._group_features: List[List[str]] = []
        self._group_devices: List[str] = []
        for index in sorted(set(assignment)):
            members = [t for i, t in enumerate(configs) if assignment[i] == index]
            group = QuantEmbeddingCollection(
                members, device=devices[index], dtype=members[0].data_type,
                per_table={t.name: t.data_type for t in members}, row_alignment=source._row_alignment,
                bounds_check=source._bounds_check, kernel_backend=source.kernel,
            )  # fmt: skip
            for t in members:
                group._stored_tables()[t.name].weight.copy_(source._stored_tables()[t.name].weight)
            self.groups.append(group)
            self._group_features.append([f for t in members for f in t.feature_names])
            self._group_devices.append(str(devices[index]))
        self._configs = list(configs)
        self._output_device: str = str(out)

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._configs

    def group_devices(self) -> List[str]:
        return list(self._group_devices)

    def forward(
        self, features: KeyedJaggedTensor
    ) -> Tuple[Dict[str, JaggedTensor], Optional[KeyedJaggedTensor]]:
        remapped = self._managed_collision_collection(features.to(torch.device(self._output_device)))
        rows: Dict[str, JaggedTensor] = {}
        g = 0
        for group in self.groups:
            part = remapped.permute_to_keys(self._group_features[g]).to(torch.device(self._group_devices[g]))
            got: Dict[str, JaggedTensor] = group(part)
            for name, jt in got.items():
                rows[name] = jt.to(torch.device(self._output_device))
            g += 1
        if self._return_remapped_features:
            return rows, remapped
        return rows, None


def shard_managed_collection_for_inference(
    module: QuantManagedCollisionEmbeddingCollection,
    devices: List[torch.device],
    output_device: Optional[torch.device] = None,
) -> ShardedQuantManagedCollisionEmbeddingCollection:
    """Spread ``module``'s tables over ``devices`` table-wise, biggest table first onto the least loaded."""
    source = module._embedding_module
    configs = source.embedding_configs()
    sizes = [source._stored_tables()[t.name].weight.numel() for t in configs]
    assignment = assign_tables_by_size([t.name for t in configs], sizes, len(devices))
    return ShardedQuantManagedCollisionEmbeddingCollection(module, devices, assignment, output_device)
