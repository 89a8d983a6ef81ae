"""``lightrec.kernels.row_reset.reset_rows`` on the torch and fbgemm backends (Triton: test_triton_row_reset.py)."""

from __future__ import annotations

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from tests.kernels.row_reset_case import check_reset_rows

CASES = [("torch", "ROWWISE_ADAGRAD"), ("torch", "ADAGRAD"), ("torch", "ADAM"), ("torch", "SGD")]
if fbgemm_available():
    CASES += [("fbgemm", "ROWWISE_ADAGRAD"), ("fbgemm", "ADAGRAD"), ("fbgemm", "SGD")]  # no CPU Adam in fbgemm


@pytest.mark.parametrize(("backend", "optimizer"), CASES)
def test_reset_rows(backend: str, optimizer: str) -> None:
    check_reset_rows(backend, optimizer, torch.device("cpu"))
