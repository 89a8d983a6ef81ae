"""``Timer``: step times of the GPU benchmarks (``bench_gpu.py`` and the DLRM run it drives, ``gpu_dlrm.py``).

Its own file so both import it and neither imports the other.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["Timer"]


class Timer:
    """CUDA events on a GPU (no host sync until read), ``perf_counter`` on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return float(start.elapsed_time(end))
        return (end - start) * 1e3
