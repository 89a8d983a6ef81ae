"""Where the Triton tests run, and how they shrink the kernels' tiles.

The Triton kernels run on CUDA, or on CPU tensors under Triton's interpreter. The interpreter is
switched on by ``TRITON_INTERPRET=1`` in the environment of the pytest run (it must be set before
the kernels are defined, i.e. before ``lightrec.kernels.triton_kernels`` is imported; spawned gloo
ranks inherit it). CI runs these tests in their own step::

    TRITON_INTERPRET=1 python -m pytest -q -p no:cacheprovider tests/kernels/test_triton_*.py tests/inference/test_triton_*.py

Without the variable and without a GPU they skip, saying why (the default suite stays fast).
With a GPU and no variable they run the compiled kernels on ``cuda``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightrec._triton import triton_available, triton_interpreting, triton_unavailable_reason


def _skip_reason() -> str | None:
    if not triton_available():
        return f"triton is not importable ({triton_unavailable_reason()})"
    if triton_interpreting() or torch.cuda.is_available():
        return None
    return "no CUDA device and TRITON_INTERPRET is not set (see tests/triton_support.py)"


SKIP_REASON = _skip_reason()
requires_triton = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
# Interpreter: CPU tensors. Compiled kernels: the GPU.
DEVICE = torch.device("cpu" if triton_interpreting() or not torch.cuda.is_available() else "cuda")


@pytest.fixture(params=["default-tiles", "tiny-tiles"])
def tiles(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run with the launch heuristics, then with 2-bag / 2-id tiles.

    Tiny tiles make a few ids span many backward programs, so runs of one id cross tile borders
    (the owner-sums-the-tail path) and forward programs see partial tiles.
    """
    from lightrec.kernels import triton_backend

    saved = dict(triton_backend.LAUNCH_OVERRIDES)
    if request.param == "tiny-tiles":
        triton_backend.LAUNCH_OVERRIDES.update(forward_block_b=2, backward_block_n=2, num_warps=1)
    try:
        yield request.param
    finally:
        triton_backend.LAUNCH_OVERRIDES.clear()
        triton_backend.LAUNCH_OVERRIDES.update(saved)
