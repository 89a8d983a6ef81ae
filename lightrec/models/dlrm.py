"""DLRM and DLRM-DCNv2: the click-through-rate models of the DLRM paper.

One sample flows through four arches::

    dense_features [B, I] --DenseArch (MLP)--------------------> dense  [B, D]
    sparse_features (KJT, F features) --SparseArch (EBC)-------> sparse [B, F, D]
    (dense, sparse) --InteractionArch--------------------------> [B, D + (F+1)F/2]   (DLRM)
                    --InteractionDCNArch (low-rank cross net)--> [B, (F+1)D]         (DLRM_DCN)
    --OverArch (MLP, last layer linear)------------------------> logits [B, over_arch_layer_sizes[-1]]

Every sparse feature must have the same embedding dim ``D``, equal to the dense arch's output
width, because the interaction multiplies dense and sparse vectors together.

The embedding collection may live on the ``meta`` device (to be sharded and materialized later
by ``DistributedModelParallel``); the dense arches are created on ``dense_device``. Only the
collection's configs are read at construction.

``DLRMTrain`` wraps any ``model(dense_features, sparse_features) -> logits`` into the torchrec
training contract ``forward(batch) -> (loss, (loss, logits, labels))`` with binary cross-entropy.

torchrec's other variants live here too (torchrec's path): ``DLRM_Projection`` with
``InteractionProjectionArch`` -- with ``x = [dense, sparse_0 .. sparse_{F-1}]`` flattened
(``[B, (F+1) D]``), ``P1 = branch1(x).view(B, F1, D)``, ``P2 = branch2(x).view(B, D, F2)`` and
output ``[dense | (P1 @ P2).flatten]`` ``[B, D + F1 F2]`` -- and ``DLRMWrapper`` (DLRM called
with one input object that carries its label).
"""

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from lightrec.models._sparse_arch import SparseArch
from lightrec.models.simple_deepfm import model_input_features
from lightrec.modules import _dense_checks as _checks
from lightrec.modules._dense_checks import check_positive_int
from lightrec.modules.crossnet import LowRankCrossNet
from lightrec.modules.interaction import InteractionArch, InteractionDCNArch, num_interaction_outputs
from lightrec.modules.mlp import MLP, check_layer_sizes
from lightrec.sparse import KeyedJaggedTensor

if TYPE_CHECKING:
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

__all__ = [
    "DLRM",
    "DLRMTrain",
    "DLRMWrapper",
    "DLRM_DCN",
    "DLRM_Projection",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "InteractionProjectionArch",
    "OverArch",
    "SparseArch",
]

Device = torch.device | str | None



class DenseArch(nn.Module):
    """The bottom MLP: continuous features to one ``D``-wide dense embedding.

    Args:
        in_features: ``I``, the number of dense (continuous) features.
        layer_sizes: widths of the MLP layers; the last is ``D``.
        device: where the parameters are created.

    Shapes:
        ``[B, I] -> [B, layer_sizes[-1]]`` (every layer ends with ReLU).
    """

    def __init__(self, in_features: int, layer_sizes: list[int], device: Device = None) -> None:
        super().__init__()
        self._in_features = check_positive_int("in_features", in_features)
        self.model = MLP(in_features, check_layer_sizes("layer_sizes", layer_sizes), device=device)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, I] -> [B, D]``."""
        _checks.check_matrix("dense_features", features, self._in_features)
        return self.model(features)


class OverArch(nn.Module):
    """The top MLP: interaction output to logits; the last layer has no activation.

    Args:
        in_features: width of the interaction output.
        layer_sizes: widths of the layers; ``layer_sizes[-1]`` is the number of logits (1 for CTR).
        device: where the parameters are created.

    Shapes:
        ``[B, in_features] -> [B, layer_sizes[-1]]``.
    """

    def __init__(self, in_features: int, layer_sizes: list[int], device: Device = None) -> None:
        super().__init__()
        sizes = check_layer_sizes("layer_sizes", layer_sizes)
        self._in_features = check_positive_int("in_features", in_features)
        hidden: list[nn.Module] = []
        if len(sizes) > 1:
            hidden.append(MLP(in_features, sizes[:-1], device=device))
        last_in = sizes[-2] if len(sizes) > 1 else in_features
        # A raw logit: a ReLU here would clamp every negative score to probability 0.5.
        self.model = nn.Sequential(*hidden, nn.Linear(last_in, sizes[-1], bias=True, device=device))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, in_features] -> [B, layer_sizes[-1]]``."""
        _checks.check_matrix("over arch input", features, self._in_features)
        return self.model(features)


class DLRM(nn.Module):
    """DLRM with the dot interaction.

    Args:
        embedding_bag_collection: pooled embeddings of the ``F`` sparse features; every table
            must have ``embedding_dim == dense_arch_layer_sizes[-1]``. May be on ``meta``.
        dense_in_features: ``I``, the number of dense features.
        dense_arch_layer_sizes: widths of the bottom MLP; the last one is ``D``.
        over_arch_layer_sizes: widths of the top MLP; the last one is the number of logits.
        dense_device: where the dense arches are created (default: torch's default device).

    Shapes:
        ``forward(dense_features [B, I], sparse_features KJT with stride B) -> [B, over[-1]]``.

    Raises:
        ValueError: a table's embedding dim differs from ``dense_arch_layer_sizes[-1]``, or a
            size argument is not a positive int.

    Example::

        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", num_embeddings=100,
                                     embedding_dim=8, feature_names=["f1", "f2"])], device="meta")
        model = DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[32, 8],
                     over_arch_layer_sizes=[16, 1])
    """

    def __init__(
        self,
        embedding_bag_collection: "EmbeddingBagCollection",
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dense_device: Device = None,
    ) -> None:
        super().__init__()
        dense_sizes = check_layer_sizes("dense_arch_layer_sizes", dense_arch_layer_sizes)
        check_layer_sizes("over_arch_layer_sizes", over_arch_layer_sizes)
        check_positive_int("dense_in_features", dense_in_features)
        self.sparse_arch = SparseArch(embedding_bag_collection)
        dim = dense_sizes[-1]
        if self.sparse_arch.embedding_dim != dim:
            raise ValueError(
                f"the sparse embedding dim ({self.sparse_arch.embedding_dim}) must equal "
                f"dense_arch_layer_sizes[-1] ({dim}) because the interaction takes dot products of "
                f"dense and sparse embeddings; got dense_arch_layer_sizes={dense_sizes}. Set its last "
                f"entry to {self.sparse_arch.embedding_dim} or change the tables' embedding_dim"
            )
        num_features = self.sparse_arch.num_sparse_features
        self.dense_arch = DenseArch(dense_in_features, dense_sizes, device=dense_device)
        self.inter_arch, over_in = self._interaction(num_features, dim, dense_device)
        if dense_device is not None:
            self.inter_arch.to(dense_device)
        self.over_arch = OverArch(over_in, over_arch_layer_sizes, device=dense_device)

    def _interaction(self, num_features: int, dim: int, dense_device: Device) -> tuple[nn.Module, int]:
        """The interaction arch over ``F`` features of width ``D`` and the width of its output."""
        return InteractionArch(num_features), num_interaction_outputs(num_features, dim)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """Score a batch.

        Args:
            dense_features: ``[B, I]`` float.
            sparse_features: KJT with the collection's feature keys and stride ``B``.

        Returns:
            ``[B, over_arch_layer_sizes[-1]]`` logits.
        """
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(embedded_dense, embedded_sparse))


class DLRM_DCN(DLRM):  # noqa: N801 - torchrec's public name
    """DLRM with a low-rank DCN-v2 cross net as the interaction (DLRM-DCNv2).

    Args:
        embedding_bag_collection, dense_in_features, dense_arch_layer_sizes,
        over_arch_layer_sizes, dense_device: as in ``DLRM``.
        dcn_num_layers: number of cross layers.
        dcn_low_rank_dim: rank ``r`` of each cross layer's weight.

    The cross net runs over ``[dense | sparse_0 | ... | sparse_{F-1}]`` (width ``(F+1) D``), and
    the over arch reads its ``[B, (F+1) D]`` output.
    """

    def __init__(
        self,
        embedding_bag_collection: "EmbeddingBagCollection",
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: Device = None,
    ) -> None:
        # Read by _interaction while DLRM.__init__ builds the arches (plain ints: settable before it runs).
        self._dcn_layers = check_positive_int("dcn_num_layers", dcn_num_layers)
        self._dcn_rank = check_positive_int("dcn_low_rank_dim", dcn_low_rank_dim)
        super().__init__(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes, dense_device
        )

    def _interaction(self, num_features: int, dim: int, dense_device: Device) -> tuple[nn.Module, int]:
        """:class:`InteractionDCNArch` over ``[dense | sparse_0 | ... | sparse_{F-1}]``, width ``(F+1) D``."""
        width = (num_features + 1) * dim
        crossnet = LowRankCrossNet(width, self._dcn_layers, self._dcn_rank, device=dense_device)
        return InteractionDCNArch(num_features, crossnet), width


def _logits_per_label(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[B, 1]`` or ``[B]`` as ``[B]``, checked against ``labels`` ``[B]``."""
    if logits.dim() == 2 and logits.shape[1] == 1:
        logits = logits.squeeze(1)
    if logits.shape != labels.shape:
        raise ValueError(
            f"DLRMTrain needs one logit per label: the model returned logits of shape "
            f"{tuple(logits.shape)} for labels of shape {tuple(labels.shape)}; use "
            f"over_arch_layer_sizes ending in 1 and labels of shape [B]"
        )
    return logits


# One call under fx (a shape test cannot be traced), so DLRMTrain traces as torchrec's does: a
# pipeline's tracer follows the batch through it to the sharded collections.
torch.fx.wrap("_logits_per_label")


class DLRMTrain(nn.Module):
    """Training wrapper: binary cross-entropy on a CTR model's logits.

    Args:
        dlrm_module: any module called as ``dlrm_module(dense_features, sparse_features)`` that returns
            logits ``[B, 1]`` or ``[B]`` (``DLRM``, ``DLRM_DCN``, ``FieldDeepFM``, ...); torchrec's
            argument name, so ``DLRMTrain(dlrm_module=...)`` moves over unchanged.

    ``forward(batch)`` reads ``batch.dense_features`` ``[B, I]``, ``batch.sparse_features`` (KJT)
    and ``batch.labels`` ``[B]`` (0/1, any dtype) and returns
    ``(loss, (loss.detach(), logits.detach(), labels.detach()))`` with ``logits`` ``[B]``, the
    same contract as torchrec's ``DLRMTrain`` (the loss is the batch mean).
    """

    def __init__(self, dlrm_module: nn.Module) -> None:
        super().__init__()
        if not isinstance(dlrm_module, nn.Module):
            raise TypeError(
                f"DLRMTrain(dlrm_module=...): the dlrm must be an nn.Module, got {type(dlrm_module).__name__}"
            )
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``batch -> (loss, (loss, logits [B], labels [B]))``, all but the first detached."""
        logits = _logits_per_label(self.model(batch.dense_features, batch.sparse_features), batch.labels)
        labels = batch.labels
        loss = self.loss_fn(logits, labels.to(logits.dtype))
        return loss, (loss.detach(), logits.detach(), labels.detach())


# ---------------------------------------------------------------------- torchrec's other variants
class InteractionProjectionArch(nn.Module):
    """Projected dot interaction (see the module docstring).

    Args:
        num_sparse_features: ``F``.
        interaction_branch1 / interaction_branch2: ``[B, (F+1) D] -> [B, F1 D]`` / ``[B, F2 D]``.
    """

    def __init__(self, num_sparse_features: int, interaction_branch1: nn.Module, interaction_branch2: nn.Module) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.interaction_branch1 = interaction_branch1
        self.interaction_branch2 = interaction_branch2

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        """``[B, D]``, ``[B, F, D]`` -> ``[B, D + F1 * F2]`` (``dense_features`` alone when ``F == 0``)."""
        if self.F <= 0:
            return dense_features
        # The branches read [B, (F+1) D]: a sparse stack of another count or width used to reach them
        # as a wrong-width input, reported as the branch's "dense_features".
        _checks.check_matrix("dense_features", dense_features, dense_features.shape[-1])
        _checks.check_stacked("sparse_features", sparse_features, self.F, dense_features.shape[-1])
        _checks.check_batch_size("dense_features", dense_features, "sparse_features", sparse_features)
        batch, dim = dense_features.shape
        flat = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1).reshape(batch, -1)
        left = self.interaction_branch1(flat).reshape(batch, -1, dim)
        right = self.interaction_branch2(flat).reshape(batch, dim, -1)
        return torch.cat([dense_features, torch.bmm(left, right).reshape(batch, -1)], dim=1)


class DLRM_Projection(DLRM):  # noqa: N801 - torchrec's public name
    """DLRM whose interaction is :class:`InteractionProjectionArch` (torchrec's ``DLRM_Projection``).

    Args:
        embedding_bag_collection, dense_in_features, dense_arch_layer_sizes,
        over_arch_layer_sizes, dense_device: as in ``DLRM``.
        interaction_branch1_layer_sizes / interaction_branch2_layer_sizes: MLP widths of the two
            branches; each last width must be a multiple of ``D`` (``F1 D``, ``F2 D``).

    Raises:
        ValueError: a branch's last width is not a multiple of ``D``.
    """

    def __init__(
        self,
        embedding_bag_collection: "EmbeddingBagCollection",
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        interaction_branch1_layer_sizes: list[int],
        interaction_branch2_layer_sizes: list[int],
        dense_device: Device = None,
    ) -> None:
        super().__init__(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes, dense_device
        )
        dim = dense_arch_layer_sizes[-1]
        num_features = self.sparse_arch.num_sparse_features
        projected = []
        for arg, sizes in (("interaction_branch1_layer_sizes", interaction_branch1_layer_sizes),
                           ("interaction_branch2_layer_sizes", interaction_branch2_layer_sizes)):  # fmt: skip
            sizes = check_layer_sizes(arg, sizes)
            if sizes[-1] % dim != 0:
                raise ValueError(
                    f"{arg}[-1] = {sizes[-1]} must be a multiple of the embedding dim {dim} (it is F_i * D)"
                )
            projected.append(sizes[-1] // dim)
        in_features = (num_features + 1) * dim
        self.inter_arch = InteractionProjectionArch(
            num_features,
            DenseArch(in_features, interaction_branch1_layer_sizes, device=dense_device),
            DenseArch(in_features, interaction_branch2_layer_sizes, device=dense_device),
        )
        self.over_arch = OverArch(dim + projected[0] * projected[1], over_arch_layer_sizes, device=dense_device)


class DLRMWrapper(DLRM):
    """``DLRM`` called with one input object, as torchrec's ``DLRMWrapper``.

    ``forward(model_input)`` reads ``float_features`` / ``idlist_features`` (torchrec's
    ``ModelInput``) or ``dense_features`` / ``sparse_features`` (``lightrec.Batch``). In training
    mode it returns ``(loss, logits)`` with binary cross-entropy against ``label`` / ``labels``;
    in eval mode the logits ``[B, 1]``.
    """

    def forward(self, model_input: Any) -> Any:  # type: ignore[override]
        dense, sparse = model_input_features(model_input)
        logits = super().forward(dense, sparse)
        if not self.training:
            return logits
        labels = getattr(model_input, "label", None)
        if labels is None:
            labels = getattr(model_input, "labels", None)
        if labels is None:
            raise ValueError("DLRMWrapper in training mode needs model_input.label (or .labels) for the loss")
        loss = F.binary_cross_entropy_with_logits(logits.squeeze(-1), labels.to(logits.dtype))
        return loss, logits
