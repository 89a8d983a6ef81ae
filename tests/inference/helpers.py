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
    """``kernel_backend`` values to test: the torch kernel always, fbgemm's when it imports."""
    import pytest

    return ["torch", pytest.param("fbgemm", marks=needs_fbgemm())]


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


def sequence_tables() -> list[lightrec.EmbeddingConfig]:
    """Unpooled tables over the same features as ``tables()``: t0 shared by f0 and f1, mixed widths."""
    return [
        lightrec.EmbeddingConfig(name="t0", num_embeddings=40, embedding_dim=8, feature_names=["f0", "f1"]),
        lightrec.EmbeddingConfig(name="t1", num_embeddings=31, embedding_dim=4, feature_names=["f2"]),
        lightrec.EmbeddingConfig(name="t2", num_embeddings=17, embedding_dim=6, feature_names=["f3"]),
    ]


class SequenceScorer(torch.nn.Module):
    """A KJT-only model over an ``EmbeddingCollection``: per feature, the rows of a sample's ids are
    summed, and a linear layer scores the concatenation ``[B, 1]``."""

    def __init__(self, ec: torch.nn.Module) -> None:
        super().__init__()
        self.ec = ec
        configs = ec.embedding_configs()
        self._features = [f for t in configs for f in t.feature_names]
        width = sum(t.embedding_dim * len(t.feature_names) for t in configs)
        self.linear = torch.nn.Linear(width, 1)

    def forward(self, features: lightrec.KeyedJaggedTensor) -> torch.Tensor:
        rows = self.ec(features)
        pooled = []
        for name in self._features:
            jt = rows[name]
            lengths = jt.lengths()
            values = jt.values()
            sample = torch.repeat_interleave(lengths, output_size=values.shape[0])  # sample index of every id
            pooled.append(values.new_zeros([lengths.shape[0], values.shape[1]]).index_add_(0, sample, values))
        return self.linear(torch.cat(pooled, dim=1))


def sequence_model(seed: int = 0) -> SequenceScorer:
    torch.manual_seed(seed)
    return SequenceScorer(lightrec.EmbeddingCollection(sequence_tables())).eval()
