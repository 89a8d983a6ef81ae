"""``FieldDeepFM``: DeepFM -- a factorization machine and a deep MLP sharing one set of field embeddings.

Fields are the pooled sparse features (one ``D``-wide embedding each) plus, when the model has
dense features, one more field: the dense features projected to ``D``::

    sparse_features (KJT) --SparseArch----------> [B, F, D] --+
    dense_features [B, I] --Linear(I, D)--------> [B, 1, D] --+--> fields v [B, F', D], F' = F (+ 1)
                                                                   |
    logit = first_order(v) + FM(v) + deep(v)                      [B, 1]
      first_order = Linear(F' D, 1) on the flattened fields       (w_f . v_f summed, plus a bias)
      FM          = sum_{i<j} <v_i, v_j>                          (field-wise: lightrec.modules.deepfm)
      deep        = MLP(F' D -> deep_layer_sizes) -> Linear(., 1)

The paper's first-order term gives every id a scalar weight; here it reads the id's embedding
through a per-field vector ``w_f`` instead, which keeps all per-id state in the one (shardable)
embedding table.

torchrec's ``SimpleDeepFMNN`` (its architecture, arches and parameter names; probabilities out)
lives in :mod:`lightrec.models.simple_deepfm` and is importable from here, torchrec's path.
Train ``FieldDeepFM`` with ``lightrec.models.dlrm.DLRMTrain``.

Its name says what sets it apart: the paper's *field-wise* FM. ``DeepFM`` alone is torchrec's name
of the deep component (``lightrec.modules.deepfm.DeepFM``, used here as ``DeepComponent``);
``lightrec.models.DeepFM``, this model's name before, still resolves to ``FieldDeepFM`` with a
``DeprecationWarning``.
"""

import warnings

import torch
from torch import nn

from lightrec.models._sparse_arch import SparseArch as _StackedSparseArch
from lightrec.models.simple_deepfm import (  # torchrec's torchrec.models.deepfm names
    DenseArch,
    FMInteractionArch,
    OverArch,
    SimpleDeepFMNN,
    SimpleDeepFMNNWrapper,
    SparseArch,
)
from lightrec.modules import _dense_checks as _checks
from lightrec.modules.deepfm import DeepFM as DeepComponent
from lightrec.modules.deepfm import field_factorization_machine
from lightrec.modules.mlp import MLP, check_layer_sizes
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "DenseArch",
    "FMInteractionArch",
    "FieldDeepFM",
    "OverArch",
    "SimpleDeepFMNN",
    "SimpleDeepFMNNWrapper",
    "SparseArch",
]

Device = torch.device | str | None


def _check_no_dense(dense_features: torch.Tensor | None) -> None:
    """A sparse-only FieldDeepFM accepts ``None`` or an empty ``[B, 0]`` tensor, nothing else."""
    if dense_features is not None and dense_features.numel() > 0:
        raise ValueError(
            "this FieldDeepFM was built with dense_in_features=0 but got dense_features of shape "
            f"{tuple(dense_features.shape)}; rebuild it with dense_in_features={dense_features.shape[-1]}"
        )


# Recorded as one call under fx: the None / numel test needs the runtime value.
torch.fx.wrap("_check_no_dense")


class FieldDeepFM(nn.Module):
    """DeepFM CTR model over an ``EmbeddingBagCollection``, with the paper's field-wise FM.

    Args:
        embedding_bag_collection: pooled sparse features; all tables share one ``embedding_dim``
            ``D`` (the FM takes dot products between fields). May be on ``meta``.
        dense_in_features: ``I``, number of dense features; 0 for a sparse-only model.
        deep_layer_sizes: widths of the deep MLP's hidden layers (a linear layer to 1 logit follows).
        dense_device: where the dense parameters are created.

    Shapes:
        ``forward(dense_features [B, I] (or None / [B, 0] when I == 0), sparse_features KJT)``
        ``-> [B, 1]`` logits.
    """

    def __init__(
        self,
        embedding_bag_collection: nn.Module,
        dense_in_features: int,
        deep_layer_sizes: list[int],
        dense_device: Device = None,
    ) -> None:
        super().__init__()
        if isinstance(dense_in_features, bool) or not isinstance(dense_in_features, int) or dense_in_features < 0:
            raise ValueError(f"dense_in_features must be an int >= 0, got {dense_in_features!r}")
        sizes = check_layer_sizes("deep_layer_sizes", deep_layer_sizes)
        self.sparse_arch = _StackedSparseArch(embedding_bag_collection)
        dim = self.sparse_arch.embedding_dim
        self._dense_in_features = dense_in_features
        self._num_fields = self.sparse_arch.num_sparse_features + (1 if dense_in_features > 0 else 0)
        flat = self._num_fields * dim
        # Identity stands in when there are no dense features, so the attribute always exists.
        self.dense_proj: nn.Module = (
            nn.Linear(dense_in_features, dim, device=dense_device) if dense_in_features > 0 else nn.Identity()
        )
        self.first_order = nn.Linear(flat, 1, device=dense_device)
        self.deep = DeepComponent(
            nn.Sequential(MLP(flat, sizes, device=dense_device), nn.Linear(sizes[-1], 1, device=dense_device))
        )

    @property
    def num_fields(self) -> int:
        """``F'``: sparse features, plus one when there are dense features."""
        return self._num_fields

    def forward(self, dense_features: torch.Tensor | None, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """Score a batch; see the class docstring for shapes."""
        fields = self.sparse_arch(sparse_features)  # [B, F, D]
        if self._dense_in_features > 0:
            if dense_features is None:
                raise ValueError(
                    f"this FieldDeepFM was built with dense_in_features={self._dense_in_features}, "
                    "but dense_features is None"
                )
            _checks.check_matrix("dense_features", dense_features, self._dense_in_features)
            _checks.check_batch_size("dense_features", dense_features, "sparse_features", fields)
            fields = torch.cat([self.dense_proj(dense_features).unsqueeze(1), fields], dim=1)
        else:
            _check_no_dense(dense_features)
        first = self.first_order(fields.flatten(1))
        return first + field_factorization_machine([fields]) + self.deep([fields])


def __getattr__(name: str) -> type[FieldDeepFM]:
    """``DeepFM``: the former name of :class:`FieldDeepFM` (deprecated; see the module docstring)."""
    if name == "DeepFM":
        warnings.warn(
            "lightrec.models.DeepFM is now lightrec.models.FieldDeepFM (DeepFM is torchrec's name of the deep "
            "component, lightrec.modules.DeepFM); the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return FieldDeepFM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
