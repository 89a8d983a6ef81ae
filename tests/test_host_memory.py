"""Huge-page host buffers (`lightrec._host_memory`, the quantized and the trained tables): zeroed, the asked size, 2 MiB-aligned on Linux CPUs."""

from __future__ import annotations

import sys

import pytest
import torch

from lightrec._host_memory import HUGE_PAGE_BYTES, allocate_host_buffer


@pytest.mark.parametrize("nbytes", [0, 100, HUGE_PAGE_BYTES + 123, 3 * HUGE_PAGE_BYTES])
def test_buffer_is_zeroed_and_sized(nbytes: int) -> None:
    buffer = allocate_host_buffer(nbytes)
    assert buffer.shape == (nbytes,) and buffer.dtype == torch.uint8 and buffer.is_contiguous()
    assert int(buffer.count_nonzero()) == 0
    if sys.platform.startswith("linux") and nbytes >= HUGE_PAGE_BYTES:
        assert buffer.data_ptr() % HUGE_PAGE_BYTES == 0  # aligned, so whole huge pages back it


def test_meta_device_allocates_nothing() -> None:
    assert allocate_host_buffer(5 * HUGE_PAGE_BYTES, "meta").device.type == "meta"
