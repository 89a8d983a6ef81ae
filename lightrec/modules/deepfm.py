"""DeepFM building blocks: the factorization-machine term and the deep component.

DeepFM (Guo et al., 2017) scores a sample from its ``F`` field embeddings ``v_1 .. v_F`` (each of
width ``D``) with three terms that share the embeddings::

    logit = first order  +  FM second order  +  deep MLP

Two second-order terms are offered, on purpose with different names:

* ``FactorizationMachine`` is torchrec's module, bit for bit in formula: it flattens every input
  to ``[B, n]``, concatenates them into ``x [B, M]`` and returns
  ``0.5 * ((sum_m x_m)^2 - sum_m x_m^2) = sum_{m<m'} x_m x_m'`` ``[B, 1]`` -- the pairwise
  products of *all scalars*, so inputs of mixed widths are fine (and the number differs from the
  paper's field-wise FM).
* ``field_factorization_machine`` is the paper's field-wise FM that ``lightrec.models.deepfm.FieldDeepFM``
  uses: ``sum_{i<j} <v_i, v_j> = 0.5 * sum_d ((sum_f v_fd)^2 - sum_f v_fd^2)`` over fields of one
  width ``D``.

``DeepFM`` is the deep part: it flattens and concatenates the embeddings and runs a user-given
dense module over them. The full model is ``lightrec.models.deepfm.FieldDeepFM``.

Embeddings are passed as a list so callers can mix one-field tensors ``[B, D]`` and stacked
fields ``[B, F_i, D]``.
"""

import torch
from torch import nn

from lightrec.modules import _dense_checks as _checks

__all__ = ["DeepFM", "FactorizationMachine", "field_factorization_machine"]


def _stack_fields(embeddings: list[torch.Tensor]) -> torch.Tensor:
    """``[B, D]`` / ``[B, F_i, D]`` tensors -> ``[B, sum F_i, D]``."""
    if len(embeddings) == 0:
        raise ValueError("embeddings must hold at least one tensor, got an empty list")
    width = embeddings[0].shape[-1]
    fields: list[torch.Tensor] = []
    for i, e in enumerate(embeddings):
        if e.dim() == 2:
            e = e.unsqueeze(1)
        _checks.check_stacked("embeddings[" + str(i) + "]", e, e.shape[1], width)
        _checks.check_batch_size("embeddings[0]", embeddings[0], "embeddings[" + str(i) + "]", e)
        fields.append(e)
    return torch.cat(fields, dim=1)


def _flatten_fields(embeddings: list[torch.Tensor]) -> torch.Tensor:
    """``[B, ...]`` tensors -> ``[B, total]``, each flattened after the batch dim, in list order."""
    if len(embeddings) == 0:
        raise ValueError("embeddings must hold at least one tensor, got an empty list")
    flat: list[torch.Tensor] = []
    for i, e in enumerate(embeddings):
        _checks.check_batch_size("embeddings[0]", embeddings[0], "embeddings[" + str(i) + "]", e)
        flat.append(e.flatten(1))
    return torch.cat(flat, dim=1)


# Recorded as single calls under fx: a list argument and per-input rank tests cannot be traced
# symbolically.
torch.fx.wrap("_stack_fields")
torch.fx.wrap("_flatten_fields")


class FactorizationMachine(nn.Module):
    """torchrec's FM term: pairwise products of every scalar of the flattened inputs.

    No parameters. ``forward(embeddings)`` takes a list of ``[B, ...]`` tensors (any widths; each
    is flattened after the batch dim and all are concatenated into ``x [B, M]``) and returns
    ``[B, 1]``::

        out[b] = 0.5 * ((sum_m x[b, m])^2 - sum_m x[b, m]^2) = sum_{m < m'} x[b, m] x[b, m']
    """

    def forward(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        """``list of [B, ...] -> [B, 1]``."""
        x = _flatten_fields(embeddings)  # [B, M]
        sum_of_input = x.sum(dim=1, keepdim=True)
        sum_of_square = (x * x).sum(dim=1, keepdim=True)
        return 0.5 * (sum_of_input * sum_of_input - sum_of_square)


def field_factorization_machine(embeddings: list[torch.Tensor]) -> torch.Tensor:
    """The paper's field-wise FM: the sum of pairwise dot products of all field embeddings.

    Args:
        embeddings: ``[B, D]`` (one field) or ``[B, F_i, D]`` (``F_i`` fields) tensors of one width ``D``.

    Returns:
        ``[B, 1]``: ``sum_{i<j} <v_i[b], v_j[b]>`` over all ``F = sum F_i`` fields.
    """
    fields = _stack_fields(embeddings)  # [B, F, D]
    square_of_sum = fields.sum(dim=1).pow(2)  # [B, D]
    sum_of_square = fields.pow(2).sum(dim=1)  # [B, D]
    return 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)


class DeepFM(nn.Module):
    """Deep component of DeepFM: a dense module over the concatenated embeddings.

    Args:
        dense_module: maps ``[B, sum_i numel(embeddings[i][b])]`` to ``[B, out]``, e.g. an
            ``MLP`` whose ``in_size`` is the total flattened width.

    Shapes:
        ``forward(embeddings: list of [B, ...]) -> dense_module([B, total])``; each tensor is
        flattened after the batch dimension and the results concatenated in list order.
    """

    def __init__(self, dense_module: nn.Module) -> None:
        super().__init__()
        if not isinstance(dense_module, nn.Module):
            raise TypeError(f"dense_module must be an nn.Module, got {type(dense_module).__name__}")
        self.dense_module = dense_module

    def forward(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        """``list of [B, ...] -> [B, out]``."""
        out: torch.Tensor = self.dense_module(_flatten_fields(embeddings))
        return out
