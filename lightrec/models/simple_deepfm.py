"""torchrec's ``SimpleDeepFMNN`` and its arches, same parameter names (``torchrec.models.deepfm``).

::

    dense [B, I] --DenseArch: Linear(I, H) ReLU Linear(H, D) ReLU--> d [B, D]
    sparse KJT   --SparseArch: EmbeddingBagCollection-------------> KeyedTensor, F blocks of D
    FMInteractionArch: x = [d, s_1 .. s_F]
        deep = ReLU(Linear((F + 1) D, DI)) over the flattened x          [B, DI]
        fm   = FactorizationMachine(x) (torchrec's all-scalar pairs)     [B, 1]
        -> [d | deep | fm]                                               [B, D + DI + 1]
    OverArch: Sigmoid(Linear(D + DI + 1, 1))                             [B, 1] (a probability)

State dict keys: ``sparse_arch.embedding_bag_collection.embedding_bags.<t>.weight``,
``dense_arch.model.{0,2}.*``, ``inter_arch.deep_fm.dense_module.0.*``, ``over_arch.model.0.*``
-- torchrec's, so its checkpoints load. (lightrec's own DeepFM, with a first-order term and the
field-wise FM, is ``lightrec.models.deepfm.FieldDeepFM``.)
"""

from typing import Any

import torch
from torch import nn

from lightrec.modules import _dense_checks as _checks
from lightrec.modules._dense_checks import check_positive_int
from lightrec.modules.deepfm import DeepFM, FactorizationMachine
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["DenseArch", "FMInteractionArch", "OverArch", "SimpleDeepFMNN", "SimpleDeepFMNNWrapper", "SparseArch"]


class SparseArch(nn.Module):
    """The pooled embeddings of every sparse feature: ``KJT -> KeyedTensor`` (F blocks of ``D``)."""

    def __init__(self, embedding_bag_collection: nn.Module) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        out: KeyedTensor = self.embedding_bag_collection(features)
        return out


class DenseArch(nn.Module):
    """``[B, in_features] -> [B, embedding_dim]``: two linear layers, each followed by ReLU."""

    def __init__(self, in_features: int, hidden_layer_size: int, embedding_dim: int) -> None:
        super().__init__()
        check_positive_int("hidden_layer_size", hidden_layer_size)
        check_positive_int("embedding_dim", embedding_dim)
        # read by lightrec.inference.export (dense width)
        self._in_features = check_positive_int("in_features", in_features)
        self.model = nn.Sequential(
            nn.Linear(in_features, hidden_layer_size), nn.ReLU(), nn.Linear(hidden_layer_size, embedding_dim), nn.ReLU()
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        _checks.check_matrix("dense_features", features, self._in_features)
        out: torch.Tensor = self.model(features)
        return out


class FMInteractionArch(nn.Module):
    """``[d | deep(x) | fm(x)]`` over ``x = [dense, sparse blocks...]`` (see the module docstring).

    Args:
        fm_in_features: total width of ``x`` (``D`` + the widths of the sparse features).
        sparse_feature_names: the sparse blocks to read, in order.
        deep_fm_dimension: ``DI``, the deep part's output width.
    """

    def __init__(self, fm_in_features: int, sparse_feature_names: list[str], deep_fm_dimension: int) -> None:
        super().__init__()
        check_positive_int("fm_in_features", fm_in_features)
        check_positive_int("deep_fm_dimension", deep_fm_dimension)
        self.sparse_feature_names = list(sparse_feature_names)
        self.deep_fm = DeepFM(dense_module=nn.Sequential(nn.Linear(fm_in_features, deep_fm_dimension), nn.ReLU()))
        self.fm = FactorizationMachine()

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedTensor) -> torch.Tensor:
        """``[B, D]``, KeyedTensor -> ``[B, D + DI + 1]`` (``dense_features`` alone without sparse features)."""
        if len(self.sparse_feature_names) == 0:
            return dense_features
        tensors = [dense_features] + [sparse_features[name] for name in self.sparse_feature_names]
        return torch.cat([dense_features, self.deep_fm(tensors), self.fm(tensors)], dim=1)


class OverArch(nn.Module):
    """``[B, in_features] -> [B, 1]``: one linear layer and a sigmoid (a probability, as torchrec)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        check_positive_int("in_features", in_features)
        self.model = nn.Sequential(nn.Linear(in_features, 1), nn.Sigmoid())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(features)
        return out


class SimpleDeepFMNN(nn.Module):
    """torchrec's DeepFM model (see the module docstring); returns probabilities ``[B, 1]``.

    Args:
        num_dense_features: ``I``.
        embedding_bag_collection: tables of one ``embedding_dim`` ``D``.
        hidden_layer_size: ``H``, the dense arch's hidden width.
        deep_fm_dimension: ``DI``.

    Raises:
        ValueError: no table, tables of different embedding dims, or a size argument that is not
            a positive int. ``forward`` raises ``DenseShapeError`` (a ``ValueError``) for dense
            features that are not ``[B, num_dense_features]`` floats.
    """

    def __init__(
        self, num_dense_features: int, embedding_bag_collection: nn.Module, hidden_layer_size: int, deep_fm_dimension: int
    ) -> None:
        super().__init__()
        check_positive_int("num_dense_features", num_dense_features)
        check_positive_int("hidden_layer_size", hidden_layer_size)
        check_positive_int("deep_fm_dimension", deep_fm_dimension)
        configs = list(embedding_bag_collection.embedding_bag_configs())  # type: ignore[operator]
        dims = sorted({c.embedding_dim for c in configs})
        if len(dims) != 1:
            raise ValueError(
                f"SimpleDeepFMNN needs at least one table and one embedding_dim for all tables, got dims {dims}"
            )
        dim = dims[0]
        names = [f for c in configs for f in c.feature_names]
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(num_dense_features, hidden_layer_size, dim)
        self.inter_arch = FMInteractionArch(dim + dim * len(names), names, deep_fm_dimension)
        self.over_arch = OverArch(dim + deep_fm_dimension + 1)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """``[B, I]``, KJT -> ``[B, 1]`` probabilities."""
        embedded = self.inter_arch(self.dense_arch(dense_features), self.sparse_arch(sparse_features))
        out: torch.Tensor = self.over_arch(embedded)
        return out


class SimpleDeepFMNNWrapper(SimpleDeepFMNN):
    """``SimpleDeepFMNN`` called with one input object: torchrec's ``ModelInput`` (``float_features``,
    ``idlist_features``) or a ``lightrec.Batch`` (``dense_features``, ``sparse_features``)."""

    def forward(self, model_input: Any) -> torch.Tensor:  # type: ignore[override]
        dense, sparse = model_input_features(model_input)
        return super().forward(dense, sparse)


def model_input_features(model_input: Any) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """``(dense, sparse)`` of a torchrec ``ModelInput`` or a ``lightrec.Batch``-like object."""
    for dense_attr, sparse_attr in (("float_features", "idlist_features"), ("dense_features", "sparse_features")):
        if hasattr(model_input, dense_attr) and hasattr(model_input, sparse_attr):
            return getattr(model_input, dense_attr), getattr(model_input, sparse_attr)
    raise TypeError(
        f"expected an input with float_features/idlist_features (torchrec's ModelInput) or "
        f"dense_features/sparse_features (lightrec.Batch), got {type(model_input).__name__}"
    )
