"""The kernel interface's row access on the Triton kernel (CI runs this file under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest

from lightrec.kernels import EmbOptimType
from tests.kernels.test_kernel_interface import OPTIMIZERS
from tests.kernels.test_kernel_interface import test_read_write_and_reset_rows as read_write_and_reset_rows
from tests.triton_support import requires_triton


@requires_triton
@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: k.name)
def test_triton_read_write_and_reset_rows(kind: EmbOptimType) -> None:
    read_write_and_reset_rows("triton", kind)
