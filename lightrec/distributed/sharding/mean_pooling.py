"""torchrec's mean-pooling divisor for row-wise sharded ``EmbeddingBagCollection`` s.

A row-wise (or table-row-wise) shard only sees some of a bag's ids, so torchrec sums on every
shard and divides the reduced sum by the bag's length afterwards. ``_create_mean_pooling_divisor``
builds that divisor, ``[B, sum of embedding dims]`` laid out like the output ``KeyedTensor``
(each feature's length repeated over its columns, 1 for sum-pooled features, ``+ 1e-6`` so an
empty bag divides 0 by ~0 into 0); ``_apply_mean_pooling`` divides by it.

lightrec's own shardings mean-pool with per-id weights ``1 / length`` before the reduction
(``common.mean_weights``): the same result, no second pass. These two are here for code written
against torchrec's sharded collections, with torchrec's arguments.
"""

from __future__ import annotations

import torch

from lightrec.modules.embedding_configs import PoolingType
from lightrec.sparse import KeyedTensor

__all__ = ["_apply_mean_pooling", "_create_mean_pooling_divisor"]

_EPS = 1e-6  # keeps an empty bag's 0 / length at 0 instead of NaN


def _create_mean_pooling_divisor(
    lengths: torch.Tensor,
    keys: list[str],
    offsets: torch.Tensor,
    stride: int,
    stride_per_key: list[int],
    dim_per_key: torch.Tensor,
    pooling_type_to_rs_features: dict[str, list[str]],
    embedding_names: list[str],
    embedding_dims: list[int],
    variable_batch_per_feature: bool,
    kjt_inverse_order: torch.Tensor,
    kjt_key_indices: dict[str, int],
    kt_key_ordering: torch.Tensor,
    inverse_indices: tuple[list[str], torch.Tensor] | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The divisor of mean pooling, ``[B, sum(embedding_dims)]`` (torchrec's arguments).

    Args:
        lengths: ``[F * B]`` bag lengths of the KJT, key-major (not modified).
        keys: the KJT's keys; ``offsets``: ``[F * B + 1]`` its offsets.
        stride: the batch size ``B``; ``stride_per_key``: per key, with variable batch sizes.
        dim_per_key: ``[F']`` each output feature's width; ``embedding_dims``: the same as a list.
        pooling_type_to_rs_features: ``{"SUM": [...], "MEAN": [...]}`` the row-wise sharded
            features by pooling; sum-pooled features get divisor 1.
        embedding_names: the output keys (more than ``keys`` when a feature feeds several tables).
        variable_batch_per_feature: the KJT has per-key batch sizes; ``inverse_indices`` (``[F, B]``)
            then expands each key's bags to the full batch (reordered by ``kjt_inverse_order``
            when it lists other keys than ``keys``).
        kjt_key_indices: ``{key: position in keys}``.
        kt_key_ordering: ``[F']`` for each output key, the KJT key it reads (when the output has
            other keys than the KJT).
        weights: ``[N]`` per-id weights: the divisor is then each bag's sum of weights.
    """
    batch_size = inverse_indices[1].size(1) if variable_batch_per_feature and inverse_indices is not None else stride
    if weights is not None:
        bags = torch.repeat_interleave(torch.arange(offsets.numel() - 1, device=offsets.device), offsets.diff())
        lengths = torch.zeros(offsets.numel() - 1, dtype=weights.dtype, device=weights.device).index_add_(
            0, bags, weights
        )
    else:
        lengths = lengths.clone()
    if variable_batch_per_feature:
        if inverse_indices is None:
            raise ValueError("variable_batch_per_feature=True needs inverse_indices (the KJT's inverse_indices())")
        expand = inverse_indices[1]
        if len(keys) != len(inverse_indices[0]):
            expand = expand.index_select(0, kjt_inverse_order)
        starts = torch.tensor([0, *stride_per_key[:-1]], device=expand.device).cumsum(0).unsqueeze(-1)
        lengths = lengths.index_select(0, (expand + starts).flatten())
    for feature in pooling_type_to_rs_features.get(PoolingType.SUM.value, []):
        first = kjt_key_indices[feature] * batch_size
        lengths[first : first + batch_size] = 1
    if len(embedding_names) != len(keys):
        lengths = lengths.reshape(-1, batch_size).index_select(0, kt_key_ordering).reshape(-1)
    per_sample = lengths.reshape(-1, batch_size).T  # [B, F']
    divisor = torch.repeat_interleave(per_sample, dim_per_key, dim=1, output_size=sum(embedding_dims))
    return (divisor + _EPS).detach()


def _apply_mean_pooling(keyed_tensor: KeyedTensor, divisor: torch.Tensor) -> KeyedTensor:
    """``keyed_tensor`` with its values divided by ``divisor`` (same keys and widths)."""
    return KeyedTensor(
        keys=keyed_tensor.keys(),
        length_per_key=keyed_tensor.length_per_key(),
        values=keyed_tensor.values() / divisor,
        key_dim=1,
    )
