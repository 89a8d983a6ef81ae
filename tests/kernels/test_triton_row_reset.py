"""``reset_rows`` on the Triton backend (CUDA, or CPU under ``TRITON_INTERPRET=1``; see tests/triton_support.py)."""

from __future__ import annotations

import pytest

from tests.kernels.row_reset_case import check_reset_rows
from tests.triton_support import DEVICE, requires_triton


@requires_triton
@pytest.mark.parametrize("optimizer", ["ROWWISE_ADAGRAD", "ADAGRAD", "ADAM", "SGD"])
def test_reset_rows_triton(optimizer: str) -> None:
    check_reset_rows("triton", optimizer, DEVICE)
