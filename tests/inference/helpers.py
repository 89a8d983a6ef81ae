"""Small models and batches shared by the inference tests."""

from __future__ import annotations

import torch

import lightrec
from lightrec._fbgemm import fbgemm_available
from lightrec.models import DLRM

FEATURES = ["f0", "f1", "f2", "f3"]


def needs_fbgemm():
    import pytest

    return pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu is unavailable (LIGHTREC_BLOCK_FBGEMM=1?)")


def kernel_params() -> list:
    """``use_fbgemm`` values to test: the torch kernel always, fbgemm's when it imports."""
    import pytest

    return [False, pytest.param(True, marks=needs_fbgemm())]


def tables(dim: int = 8, mean_last: bool = True) -> list[lightrec.EmbeddingBagConfig]:
    out = [
        lightrec.EmbeddingBagConfig(name="t0", num_embeddings=40, embedding_dim=dim, feature_names=["f0", "f1"]),
        lightrec.EmbeddingBagConfig(name="t1", num_embeddings=31, embedding_dim=dim, feature_names=["f2"]),
        lightrec.EmbeddingBagConfig(name="t2", num_embeddings=17, embedding_dim=dim, feature_names=["f3"]),
    ]
    if mean_last:
        out[2].pooling = lightrec.PoolingType.MEAN
    return out


def kjt(batch: int = 5, seed: int = 0, weighted: bool = False, max_len: int = 4) -> lightrec.KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    rows = {"f0": 40, "f1": 40, "f2": 31, "f3": 17}
    lengths = torch.randint(0, max_len + 1, (len(FEATURES) * batch,), generator=g)
    values = torch.cat([
        torch.randint(0, rows[f], (int(lengths[i * batch:(i + 1) * batch].sum()),), generator=g)
        for i, f in enumerate(FEATURES)
    ])
    weights = torch.rand(values.shape[0], generator=g) if weighted else None
    return lightrec.KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths, weights=weights)


def dlrm(seed: int = 0) -> DLRM:
    torch.manual_seed(seed)
    ebc = lightrec.EmbeddingBagCollection(tables(mean_last=False))
    return DLRM(ebc, dense_in_features=5, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval()
