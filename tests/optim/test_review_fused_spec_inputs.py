"""``optimizer_class_to_spec`` names a non-class optimizer argument (review).

``FusedEmbeddingBagCollection(tables, FusedOptimizerSpec(...))`` passes the spec where the
optimizer class goes; it used to fail inside ``issubclass`` ("arg 1 must be a class"), which named
neither the argument nor the fix.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection
from lightrec.modules import EmbeddingBagConfig
from lightrec.optim import EmbOptimType, FusedOptimizerSpec, optimizer_class_to_spec


@pytest.mark.parametrize("bad", [FusedOptimizerSpec(EmbOptimType.ADAM), "adam", torch.optim.Adam([torch.zeros(1, requires_grad=True)])])
def test_a_non_class_optimizer_is_refused_by_name(bad: object) -> None:
    with pytest.raises(TypeError, match=r"optimizer_class must be an optimizer class.*fused_params"):
        optimizer_class_to_spec(bad, {})  # type: ignore[arg-type]


def test_fused_collection_given_a_spec_positionally_says_to_use_fused_params() -> None:
    tables = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=3, feature_names=["f"])]
    with pytest.raises(TypeError, match=r"got FusedOptimizerSpec"):
        FusedEmbeddingBagCollection(tables, FusedOptimizerSpec(EmbOptimType.ADAM))  # type: ignore[arg-type]
    ok = FusedEmbeddingBagCollection(tables, fused_params=FusedOptimizerSpec(EmbOptimType.ADAM), kernel_backend="torch")
    assert ok.fused_optimizer is not None
