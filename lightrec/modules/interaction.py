"""Feature interaction layers of DLRM: pairwise dot products, or a DCN cross net.

Both take the dense arch output and the pooled sparse embeddings, all of one width ``D``::

    dense_features   [B, D]          one "dense embedding" per sample
    sparse_features  [B, F, D]       F pooled sparse feature embeddings per sample

``InteractionArch`` (DLRM paper, "dot" interaction) stacks the ``F + 1`` vectors of a sample,
takes every pairwise dot product ``<v_i, v_j>`` with ``i < j`` (upper triangle, no diagonal, in
row-major order: (0,1), (0,2), ..., (0,F), (1,2), ...) and appends them to the dense vector::

    out = [ dense (D) | <v_0,v_1> <v_0,v_2> ... <v_{F-1},v_F> ((F+1)F/2) ]     [B, D + (F+1)F/2]

with ``v_0 = dense`` and ``v_{f+1} = sparse_features[:, f]``.

``InteractionDCNArch`` (DLRM-DCNv2) instead flattens the same vectors into ``[B, (F+1)D]`` and
runs a cross net (``lightrec.modules.crossnet``) over them; the output keeps that width.
"""

import torch
from torch import nn

from lightrec.modules import _dense_checks as _checks

__all__ = ["InteractionArch", "InteractionDCNArch", "num_interaction_outputs"]


def num_interaction_outputs(num_sparse_features: int, embedding_dim: int) -> int:
    """Width of ``InteractionArch``'s output: ``D + (F + 1) * F / 2``."""
    return embedding_dim + (num_sparse_features + 1) * num_sparse_features // 2


def _check_num_features(num_sparse_features: object) -> int:
    if isinstance(num_sparse_features, bool) or not isinstance(num_sparse_features, int) or num_sparse_features <= 0:
        raise ValueError(
            f"num_sparse_features must be a positive int (the number of pooled sparse features), "
            f"got {num_sparse_features!r}"
        )
    return num_sparse_features


class InteractionArch(nn.Module):
    """DLRM dot interaction: pairwise dot products of the dense and sparse embeddings.

    Args:
        num_sparse_features: ``F``, the number of sparse feature embeddings per sample.

    Shapes:
        ``forward(dense_features [B, D], sparse_features [B, F, D]) -> [B, D + (F+1)F/2]``
        (see the module docstring for the order of the pairs).

    The module has no parameters; the pair indices are non-persistent buffers, so they move
    with ``.to()`` but never appear in a ``state_dict``.
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self._num_sparse_features = _check_num_features(num_sparse_features)
        n = num_sparse_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("triu_rows", rows, persistent=False)
        self.register_buffer("triu_cols", cols, persistent=False)

    @property
    def num_sparse_features(self) -> int:
        return self._num_sparse_features

    def output_size(self, embedding_dim: int) -> int:
        """Output width for embeddings of width ``embedding_dim``."""
        return num_interaction_outputs(self._num_sparse_features, embedding_dim)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        """Concatenate ``dense_features`` with all pairwise dot products.

        Args:
            dense_features: ``[B, D]``.
            sparse_features: ``[B, F, D]``.

        Returns:
            ``[B, D + (F + 1) * F / 2]``.
        """
        _checks.check_matrix("dense_features", dense_features, dense_features.shape[-1])
        _checks.check_stacked(
            "sparse_features", sparse_features, self._num_sparse_features, dense_features.shape[-1]
        )
        _checks.check_batch_size("dense_features", dense_features, "sparse_features", sparse_features)
        # [B, F+1, D]: row 0 is the dense vector, rows 1..F the sparse embeddings.
        stacked = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1)
        # [B, F+1, F+1] Gram matrix of each sample; only the strict upper triangle is kept.
        gram = torch.bmm(stacked, stacked.transpose(1, 2))
        pairs = gram[:, self.triu_rows, self.triu_cols]
        return torch.cat([dense_features, pairs], dim=1)


class InteractionDCNArch(nn.Module):
    """DLRM-DCNv2 interaction: a cross net over the flattened dense and sparse embeddings.

    Args:
        num_sparse_features: ``F``.
        crossnet: a module mapping ``[B, (F+1) * D] -> [B, (F+1) * D]`` (``CrossNet``,
            ``LowRankCrossNet`` or ``VectorCrossNet``).

    Shapes:
        ``forward(dense_features [B, D], sparse_features [B, F, D]) -> [B, (F+1) * D]``; the input
        of the cross net is ``[dense | sparse_0 | ... | sparse_{F-1}]``.
    """

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self._num_sparse_features = _check_num_features(num_sparse_features)
        if not isinstance(crossnet, nn.Module):
            raise TypeError(f"crossnet must be an nn.Module, got {type(crossnet).__name__}")
        self.crossnet = crossnet

    @property
    def num_sparse_features(self) -> int:
        return self._num_sparse_features

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        """Cross the concatenated embeddings.

        Args:
            dense_features: ``[B, D]``.
            sparse_features: ``[B, F, D]``.

        Returns:
            ``[B, (F + 1) * D]``.
        """
        _checks.check_matrix("dense_features", dense_features, dense_features.shape[-1])
        _checks.check_stacked(
            "sparse_features", sparse_features, self._num_sparse_features, dense_features.shape[-1]
        )
        _checks.check_batch_size("dense_features", dense_features, "sparse_features", sparse_features)
        combined = torch.cat([dense_features, sparse_features.flatten(1)], dim=1)
        return self.crossnet(combined)
