"""Per-sample weights of another float dtype than the table are cast, as fbgemm casts them.

A float16 table (Lightning's "16-true") fed float32 weights from the data loader, or float64
weights on any table, failed on the torch kernel and the plain collection with embedding_bag's
"Expected tensor ... to have the same type" while the fbgemm kernel casts them. The reference here
is plain ``F.embedding_bag`` on float64 copies of the table and the weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

_IDS = torch.tensor([1, 2, 3, 7, 7])
_LENGTHS = torch.tensor([2, 0, 3])
_OFFSETS = torch.tensor([0, 2, 2, 5])
_WEIGHTS = [0.5, 1.25, 2.0, -1.5, 0.75]


def _collection(kind: str, table_dtype: torch.dtype) -> torch.nn.Module:
    tables = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])]
    if kind == "plain":
        module: torch.nn.Module = EmbeddingBagCollection(tables=tables, is_weighted=True)
    else:
        module = FusedEmbeddingBagCollection(
            tables=tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.0}, is_weighted=True,
            kernel_backend="torch",
        )  # fmt: skip
    return module.to(table_dtype)


def _table(module: torch.nn.Module) -> torch.Tensor:
    return next(t for n, t in module.state_dict().items() if n.endswith("weight")).detach()


@pytest.mark.parametrize("kind", ["plain", "fused_torch_kernel"])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.float64, torch.float32, torch.float16])
def test_weights_of_another_dtype_are_cast_to_the_table(
    kind: str, table_dtype: torch.dtype, weight_dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    module = _collection(kind, table_dtype)
    weights = torch.tensor(_WEIGHTS, dtype=weight_dtype, requires_grad=True)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=_IDS, lengths=_LENGTHS, weights=weights)
    out = module(kjt).values()
    assert out.dtype == table_dtype
    out.float().sum().backward()

    table = _table(module).double().requires_grad_(False)
    ref_weights = torch.tensor(_WEIGHTS, dtype=weight_dtype).double().requires_grad_(True)
    expected = F.embedding_bag(_IDS, table, _OFFSETS, mode="sum", per_sample_weights=ref_weights,
                               include_last_offset=True)  # fmt: skip
    expected.sum().backward()
    tol = 1e-2 if torch.float16 in (table_dtype, weight_dtype) else 1e-5
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    assert weights.grad is not None and weights.grad.dtype == weight_dtype
    torch.testing.assert_close(weights.grad.double(), ref_weights.grad, atol=tol, rtol=tol)
