"""torchrec's SimpleDeepFMNN against a plain-torch reference, its bad arguments and bad dense
inputs (typed errors naming the argument), and InteractionProjectionArch's sparse-shape check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightrec.models.dlrm import DenseArch, InteractionProjectionArch
from lightrec.models.simple_deepfm import SimpleDeepFMNN
from lightrec.modules import EmbeddingBagCollection
from lightrec.modules._dense_checks import DenseShapeError
from tests.models.helpers import random_kjt, reference_pooled, tables

B, NUM_DENSE = 5, 3


def test_simple_deepfm_matches_torchrec_formula() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables(4))
    model = SimpleDeepFMNN(NUM_DENSE, ebc, hidden_layer_size=7, deep_fm_dimension=5)
    g = torch.Generator().manual_seed(1)
    kjt, dense = random_kjt(B, g), torch.randn(B, NUM_DENSE, generator=g)
    sd = model.state_dict()
    d = torch.relu(dense @ sd["dense_arch.model.0.weight"].T + sd["dense_arch.model.0.bias"])
    d = torch.relu(d @ sd["dense_arch.model.2.weight"].T + sd["dense_arch.model.2.bias"])
    x = torch.cat([d, *reference_pooled(ebc, kjt)], 1)  # [B, (F+1) D]
    deep = torch.relu(x @ sd["inter_arch.deep_fm.dense_module.0.weight"].T + sd["inter_arch.deep_fm.dense_module.0.bias"])
    fm = 0.5 * (x.sum(1, keepdim=True) ** 2 - (x * x).sum(1, keepdim=True))
    inter = torch.cat([d, deep, fm], 1)
    expected = torch.sigmoid(inter @ sd["over_arch.model.0.weight"].T + sd["over_arch.model.0.bias"])
    torch.testing.assert_close(model(dense, kjt), expected)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"num_dense_features": 0}, "num_dense_features"),
        ({"hidden_layer_size": 0}, "hidden_layer_size"),
        ({"deep_fm_dimension": -1}, "deep_fm_dimension"),
        ({"hidden_layer_size": 2.5}, "hidden_layer_size"),
    ],
)
def test_simple_deepfm_bad_sizes_name_the_argument(kwargs: dict[str, object], arg: str) -> None:
    args: dict[str, object] = {"num_dense_features": NUM_DENSE, "hidden_layer_size": 7, "deep_fm_dimension": 5, **kwargs}
    with pytest.raises(ValueError, match=rf"{arg} must be a positive int, got {kwargs[arg]!r}"):
        SimpleDeepFMNN(embedding_bag_collection=EmbeddingBagCollection(tables(4)), **args)  # type: ignore[arg-type]


def test_simple_deepfm_wrong_dense_input_is_a_typed_error() -> None:
    model = SimpleDeepFMNN(NUM_DENSE, EmbeddingBagCollection(tables(4)), hidden_layer_size=7, deep_fm_dimension=5)
    kjt = random_kjt(B, torch.Generator().manual_seed(0))
    with pytest.raises(DenseShapeError, match=r"dense_features must have shape \[batch_size, 3\], got \[5, 4\]"):
        model(torch.randn(B, NUM_DENSE + 1), kjt)
    with pytest.raises(DenseShapeError, match="dense_features must be a floating-point tensor"):
        model(torch.ones(B, NUM_DENSE, dtype=torch.long), kjt)


def test_projection_arch_checks_the_sparse_stack() -> None:
    dim, f = 4, 3
    arch = InteractionProjectionArch(f, DenseArch((f + 1) * dim, [8]), DenseArch((f + 1) * dim, [8]))
    dense = torch.randn(B, dim)
    assert arch(dense, torch.randn(B, f, dim)).shape == (B, dim + 2 * 2)
    # A stack of 2 features used to reach branch 1 as a wrong-width "dense_features".
    with pytest.raises(DenseShapeError, match=r"sparse_features must have shape \[batch_size, 3, 4\], got \[5, 2, 4\]"):
        arch(dense, torch.randn(B, 2, dim))
    identity = InteractionProjectionArch(f, nn.Identity(), nn.Identity())
    with pytest.raises(DenseShapeError, match="sparse_features"):  # used to return a silently wrong result
        identity(dense, torch.randn(B, 2, dim))
