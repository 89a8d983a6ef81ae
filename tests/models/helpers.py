"""Shared fixtures for model tests: tiny tables, random KJT batches, plain-torch references."""

from dataclasses import dataclass

import torch
from torch import nn

from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor


@dataclass
class FakeBatch:
    """Stands in for ``lightrec.data.Batch`` where a test needs fields the real one rejects."""

    dense_features: torch.Tensor | None
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor | None


def tables(dim: int = 4, dims: tuple[int, int] | None = None) -> list[EmbeddingBagConfig]:
    """Table ``t0`` shared by features ``f0``/``f1``, table ``t1`` for ``f2``."""
    d0, d1 = dims if dims is not None else (dim, dim)
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=d0, feature_names=["f0", "f1"]),
        EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=d1, feature_names=["f2"]),
    ]


def random_kjt(batch: int, generator: torch.Generator, f0_ids: torch.Tensor | None = None) -> KeyedJaggedTensor:
    """``f0``: one id per sample (``f0_ids`` when given); ``f1``/``f2``: 0..2 ids, empty bags included."""
    if f0_ids is None:
        f0_ids = torch.randint(0, 20, (batch,), generator=generator)
    l1 = torch.randint(0, 3, (batch,), generator=generator)
    l2 = torch.randint(0, 3, (batch,), generator=generator)
    l1[0] = 0
    v1 = torch.randint(0, 20, (int(l1.sum()),), generator=generator)
    v2 = torch.randint(0, 10, (int(l2.sum()),), generator=generator)
    return KeyedJaggedTensor(
        keys=["f0", "f1", "f2"],
        values=torch.cat([f0_ids, v1, v2]),
        lengths=torch.cat([torch.ones(batch, dtype=torch.long), l1, l2]),
    )


def reference_pooled(ebc: EmbeddingBagCollection, kjt: KeyedJaggedTensor) -> list[torch.Tensor]:
    """One ``[B, D]`` SUM-pooled tensor per feature, in table order, by explicit row sums."""
    out = []
    for config in ebc.embedding_bag_configs():
        weight = ebc.embedding_bags[config.name].weight
        for feature in config.feature_names:
            jt = kjt[feature]
            rows = [weight[ids].sum(0) if ids.numel() else weight.new_zeros(weight.shape[1]) for ids in jt.to_dense()]
            out.append(torch.stack(rows))
    return out


def linears(module: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of ``module`` in registration (= execution) order."""
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def reference_mlp(layers: list[nn.Linear], x: torch.Tensor, last_activation: bool) -> torch.Tensor:
    for i, layer in enumerate(layers):
        x = x @ layer.weight.t() + layer.bias
        if i < len(layers) - 1 or last_activation:
            x = torch.relu(x)
    return x
