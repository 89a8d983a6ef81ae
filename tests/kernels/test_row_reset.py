"""``reset_rows`` (and ``reset_rows_of_tables``) on the torch and fbgemm backends (Triton: test_triton_row_reset.py)."""

from __future__ import annotations

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.modules.managed_collision.ops import uniform_block
from tests.kernels.row_reset_case import check_reset_rows

CASES = [("torch", "ROWWISE_ADAGRAD"), ("torch", "ADAGRAD"), ("torch", "ADAM"), ("torch", "SGD")]
if fbgemm_available():
    CASES += [("fbgemm", "ROWWISE_ADAGRAD"), ("fbgemm", "ADAGRAD"), ("fbgemm", "SGD")]  # no CPU Adam in fbgemm


@pytest.mark.parametrize(("backend", "optimizer"), CASES)
def test_reset_rows(backend: str, optimizer: str) -> None:
    check_reset_rows(backend, optimizer, torch.device("cpu"))


@pytest.mark.parametrize(("backend", "optimizer"), CASES)
def test_reset_rows_of_tables_equals_one_reset_per_table(backend: str, optimizer: str) -> None:
    """The batched reset (one kernel call for every table a managed-collision step evicted in)
    leaves the storage exactly as ``reset_rows`` table by table does."""
    bags = [
        BatchedEmbeddingBag([(7, 4), (6, 8), (5, 4)], optimizer={"optimizer": optimizer, "learning_rate": 0.1},
                            kernel_backend=backend)  # fmt: skip
        for _ in range(2)
    ]
    with torch.no_grad():
        for a, b in zip(bags[0].kernel.split_embedding_weights(), bags[1].kernel.split_embedding_weights(), strict=True):
            b.copy_(a)
    indices, offsets = torch.tensor([0, 3, 6, 1, 4, 5, 2, 1, 0]), torch.tensor([0, 2, 3, 6, 8, 9, 9])
    for bag in bags:
        bag(indices, offsets).pow(2).sum().backward()
    resets = {"t2": (torch.tensor([4, 0]), torch.full((2, 4), 3.0)), "t0": (torch.tensor([6, 3, 1]), torch.ones(3, 4))}
    bags[0].reset_rows_of_tables(resets)
    for table, (rows, values) in resets.items():
        bags[1].reset_rows(table, rows, values)
    for a, b in zip(bags[0].kernel.split_embedding_weights(), bags[1].kernel.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(bags[0].kernel.split_optimizer_states(), bags[1].kernel.split_optimizer_states(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(bags[0].kernel.split_embedding_weights()[0][[6, 3, 1]], torch.ones(3, 4))
    with pytest.raises(KeyError, match="no table 'nope'"):
        bags[0].reset_rows_of_tables({"nope": (torch.tensor([0]), torch.zeros(1, 4))})


@pytest.mark.parametrize(("backend", "optimizer"), CASES)
@pytest.mark.parametrize("native", [True, False])
def test_reset_rows_uniform_of_tables_writes_the_uniform_block(
    backend: str, optimizer: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's own draw of fresh rows (native on CPU, or torch ops) equals ``reset_rows`` with
    ``managed_collision.ops.uniform_block`` values: what a managed-collision step would have written."""
    if not native:
        monkeypatch.setenv("LIGHTREC_MCH_NATIVE", "0")
    bags = [
        BatchedEmbeddingBag([(7, 4), (6, 8)], optimizer={"optimizer": optimizer, "learning_rate": 0.1},
                            kernel_backend=backend)  # fmt: skip
        for _ in range(2)
    ]
    with torch.no_grad():
        for a, b in zip(bags[0].kernel.split_embedding_weights(), bags[1].kernel.split_embedding_weights(), strict=True):
            b.copy_(a)
    for bag in bags:
        bag(torch.tensor([0, 3, 6, 1, 4, 5]), torch.tensor([0, 2, 3, 5, 6])).pow(2).sum().backward()
    draws = {"t1": (torch.tensor([5, 0, 2]), 2**62 + 7, -0.5, 0.25), "t0": (torch.tensor([6, 1]), 3, -0.01, 0.01)}
    bags[0].reset_rows_uniform_of_tables(draws)
    dims = {"t0": 4, "t1": 8}
    bags[1].reset_rows_of_tables({t: (rows, uniform_block(rows.numel(), dims[t], seed, lo, hi, torch.float32))
                                  for t, (rows, seed, lo, hi) in draws.items()})  # fmt: skip
    for a, b in zip(bags[0].kernel.split_embedding_weights(), bags[1].kernel.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(bags[0].kernel.split_optimizer_states(), bags[1].kernel.split_optimizer_states(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises((KeyError, RuntimeError, IndexError), match="outside|out of bounds"):
        bags[0].reset_rows_uniform_of_tables({"t0": (torch.tensor([7]), 1, 0.0, 1.0)})
