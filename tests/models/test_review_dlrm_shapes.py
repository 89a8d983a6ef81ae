"""DLRM and DLRM_DCN against a plain-PyTorch reference built from the state dict by key, over edge
shapes (batch 0 and 1, one dense feature, one sparse feature, odd over-arch widths); bad inputs
and bad DLRM_Projection branch sizes give typed errors naming the argument."""

import itertools

import pytest
import torch

from lightrec.models import DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.modules._dense_checks import DenseShapeError
from lightrec.modules.feature_checks import FeatureKeyError
from lightrec.sparse import KeyedJaggedTensor
from tests.models.helpers import FakeBatch

D = 3


def _ebc(num_features: int) -> EmbeddingBagCollection:
    names = [f"f{i}" for i in range(num_features)]
    return EmbeddingBagCollection([
        EmbeddingBagConfig(name="t0", num_embeddings=11, embedding_dim=D, feature_names=names[:1]),
        *([EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=D, feature_names=names[1:])] if num_features > 1 else []),
    ])  # fmt: skip


def _kjt(batch: int, num_features: int, g: torch.Generator) -> KeyedJaggedTensor:
    lengths = torch.randint(0, 3, (batch * num_features,), generator=g)
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=[f"f{i}" for i in range(num_features)], values=values, lengths=lengths)


def _mlp(state: dict[str, torch.Tensor], prefix: str, x: torch.Tensor) -> torch.Tensor:
    i = 0
    while f"{prefix}{i}._linear.weight" in state:
        x = torch.relu(x @ state[f"{prefix}{i}._linear.weight"].t() + state[f"{prefix}{i}._linear.bias"])
        i += 1
    return x


def _pooled(state: dict[str, torch.Tensor], kjt: KeyedJaggedTensor, num_features: int) -> list[torch.Tensor]:
    out = []
    for f in range(num_features):
        table = state[f"sparse_arch.embedding_bag_collection.embedding_bags.{'t0' if f == 0 else 't1'}.weight"]
        bags = kjt[f"f{f}"].to_dense()
        out.append(torch.stack([table[ids].sum(0) for ids in bags]) if bags else table.new_zeros(0, D))
    return out


def _reference(state: dict[str, torch.Tensor], dense: torch.Tensor, kjt: KeyedJaggedTensor, num_features: int) -> torch.Tensor:
    """torchrec's DLRM / DLRM_DCN formulas over the weights read by state-dict key."""
    x = _mlp(state, "dense_arch.model._mlp.", dense)
    vectors = [x, *_pooled(state, kjt, num_features)]
    if "inter_arch.crossnet.W_kernels.0" in state:
        x0 = torch.cat(vectors, dim=1)
        xl, layer = x0, 0
        while f"inter_arch.crossnet.W_kernels.{layer}" in state:
            w, v = state[f"inter_arch.crossnet.W_kernels.{layer}"], state[f"inter_arch.crossnet.V_kernels.{layer}"]
            xl = x0 * (xl @ v.t() @ w.t() + state[f"inter_arch.crossnet.bias.{layer}"][:, 0]) + xl
            layer += 1
        z = xl
    else:
        pairs = [(vectors[i] * vectors[j]).sum(1, keepdim=True) for i, j in itertools.combinations(range(len(vectors)), 2)]
        z = torch.cat([x, *pairs], dim=1)
    hidden = _mlp(state, "over_arch.model.0._mlp.", z)
    return hidden @ state["over_arch.model.1.weight"].t() + state["over_arch.model.1.bias"]


@pytest.mark.parametrize("dcn", [False, True])
@pytest.mark.parametrize(
    ("batch", "dense_in", "num_features", "dense_sizes", "over_sizes"),
    [(0, 1, 1, [D], [3, 1]), (1, 1, 1, [5, D], [5, 3, 1]), (1, 2, 3, [D], [7, 2]), (4, 13, 3, [9, D], [9, 5, 1]),
     (3, 1, 2, [2, D], [1, 1])],
)  # fmt: skip
def test_dlrm_matches_state_dict_reference_on_edge_shapes(
    dcn: bool, batch: int, dense_in: int, num_features: int, dense_sizes: list[int], over_sizes: list[int]
) -> None:
    torch.manual_seed(0)
    ebc = _ebc(num_features)
    if dcn:
        model: DLRM = DLRM_DCN(ebc, dense_in, dense_sizes, over_sizes, dcn_num_layers=2, dcn_low_rank_dim=2)
    else:
        model = DLRM(ebc, dense_in, dense_sizes, over_sizes)
    with torch.no_grad():  # non-zero cross-net biases, so a missing bias term would show
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_()
    g = torch.Generator().manual_seed(batch)
    dense, kjt = torch.randn(batch, dense_in, generator=g), _kjt(batch, num_features, g)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = model(dense, kjt)
    assert out.shape == (batch, over_sizes[-1])
    torch.testing.assert_close(out, _reference(state, dense, kjt, num_features))
    if over_sizes[-1] == 1:
        labels = torch.randint(0, 2, (batch,), generator=g)
        loss, (loss_d, logits, labels_out) = DLRMTrain(model)(FakeBatch(dense, kjt, labels))
        torch.testing.assert_close(logits, out.squeeze(1).detach())
        assert labels_out is not labels and torch.equal(labels_out, labels)
        if batch:
            expected = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), labels.float())
            torch.testing.assert_close(loss, expected)
            assert not loss_d.requires_grad and loss.requires_grad


@pytest.mark.parametrize("dcn", [False, True])
def test_dlrm_bad_inputs_give_typed_errors(dcn: bool) -> None:
    ebc = _ebc(2)
    model = DLRM_DCN(ebc, 2, [D], [3, 1], 1, 1) if dcn else DLRM(ebc, 2, [D], [3, 1])
    g = torch.Generator().manual_seed(0)
    kjt = _kjt(2, 2, g)
    with pytest.raises(DenseShapeError, match=r"dense_features must have shape \[batch_size, 2\], got \[2, 3\]"):
        model(torch.randn(2, 3), kjt)
    with pytest.raises(DenseShapeError, match="same batch size"):
        model(torch.randn(3, 2), kjt)
    missing = KeyedJaggedTensor(keys=["f0"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    with pytest.raises(FeatureKeyError, match=r"missing features \['f1'\]"):
        model(torch.randn(2, 2), missing)


@pytest.mark.parametrize(("branch1", "branch2", "arg"), [([], [D], "interaction_branch1_layer_sizes"),
                                                         ([D], D, "interaction_branch2_layer_sizes")])  # fmt: skip
def test_dlrm_projection_rejects_bad_branch_sizes_naming_the_argument(branch1, branch2, arg) -> None:  # noqa: ANN001
    with pytest.raises((ValueError, TypeError), match=arg):
        DLRM_Projection(_ebc(2), 2, [D], [3, 1], branch1, branch2)
