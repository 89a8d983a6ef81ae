"""Which kernel ``kernel_backend="auto"`` runs on CPU where fbgemm and the native torch update both serve.

fbgemm's CPU TBE (a JIT-generated row-wise update) and the torch kernel with the native fused update
(``cpu_update.py``) are close, and which one is faster depends on the processor, its caches and
memory (measured on the 2-core development machine, 13 x 100k x 64 tables, 53k ids: forward +
backward ~11-12 ms of CPU for fbgemm, ~15 ms for torch). So it is *measured once per machine*:
the first ``"auto"`` choice on CPU between the two times both on a small group (8 tables x 100k x 64,
row-wise Adagrad, 2048 one-id bags, forward + backward + update, alternating, median of thread CPU
time) and caches the winner in ``$LIGHTREC_CACHE_DIR/cpu_kernel_choice.json`` (default
``~/.cache/lightrec``) under a key of the processor, the torch and fbgemm versions and the native
library's content (a rebuilt native update is measured again), so later processes -- every rank of
later runs -- read the same answer. Configurations fbgemm cannot serve (Adam, weight decay, tables shared by features, no fbgemm) use the torch
kernel without measuring.

``LIGHTREC_CPU_KERNEL=fbgemm|torch`` decides without measuring (the test suite pins ``fbgemm``;
``auto``, the default, measures).
Ranks of a first run measure independently and may choose differently; each rank's tables are its
own, so that only changes last bits (both kernels implement the same exact rule).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from lightrec import _switches
from lightrec._native import native_ops
from lightrec.kernels.fbgemm_backend import FbgemmBatchedLookup
from lightrec.kernels.kernel_interface import EmbeddingKernel, KernelConfig, LookupBatch
from lightrec.kernels.torch_backend import TorchBatchedLookup
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

__all__ = ["cpu_kernel_preference", "measure_cpu_kernels"]

_CHOICES = ("fbgemm", "torch")


def _cache_file() -> Path:
    return _switches.CACHE_DIR.read() / "cpu_kernel_choice.json"


def _machine_key() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import importlib.metadata

        fbgemm = importlib.metadata.version("fbgemm-gpu-cpu")
    except Exception:  # noqa: BLE001 - not installed under that name
        fbgemm = "?"
    ops = native_ops()
    library = "none"
    if ops is not None:  # its content, not its path: a rebuilt (changed) update is measured again
        try:
            library = hashlib.sha256(Path(ops.library).read_bytes()).hexdigest()[:16]
        except OSError:
            library = Path(ops.library).parent.name
    return f"{model}|{os.cpu_count()}|torch {torch.__version__}|fbgemm {fbgemm}|{library}"


def measure_cpu_kernels(iterations: int = 5) -> dict[str, float]:
    """Median thread-CPU milliseconds of one forward + backward + row-wise Adagrad update per kernel."""
    tables, rows, dim, batch = 8, 100_000, 64, 2048  # rows at random from 200 MiB: TLB and cache misses count
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.01)
    gen = torch.Generator().manual_seed(0)
    lookup = LookupBatch(
        torch.randint(0, rows, (tables * batch,), generator=gen),
        torch.arange(tables * batch + 1),
        None,
        batch,
    )
    grad = torch.randn(batch, tables * dim, generator=gen)
    config = KernelConfig([rows] * tables, [dim] * tables, list(range(tables)), PoolingType.SUM, spec,
                          torch.device("cpu"))  # fmt: skip
    kernels: dict[str, EmbeddingKernel] = {
        "fbgemm": FbgemmBatchedLookup(config),
        "torch": TorchBatchedLookup(config),
    }
    for kernel in kernels.values():
        for weight in kernel.split_embedding_weights():
            weight.uniform_(-0.01, 0.01, generator=gen)
    anchor = torch.zeros(0, requires_grad=True)  # what the fused output's backward hangs off
    times: dict[str, list[float]] = {name: [] for name in _CHOICES}
    for i in range(iterations + 2):
        for name, kernel in kernels.items() if i % 2 == 0 else reversed(kernels.items()):
            start = time.thread_time()
            kernel.lookup(lookup, [anchor], lambda: 0.01).backward(grad)
            if i >= 2:  # two warm-up rounds
                times[name].append(1000.0 * (time.thread_time() - start))
    return {name: statistics.median(t) for name, t in times.items()}


@functools.cache
def cpu_kernel_preference() -> str:
    """``"fbgemm"`` or ``"torch"``: the faster fused CPU kernel on this machine (see the module docstring)."""
    forced = _switches.CPU_KERNEL.read()  # SwitchError (a ValueError) on a word it does not know
    if forced != "auto":
        return forced
    key = _machine_key()
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, dict) and entry.get("choice") in _CHOICES:
        return str(entry["choice"])
    ms = measure_cpu_kernels()
    choice = min(ms, key=lambda name: ms[name])
    cached[key] = {"choice": choice, "ms": ms}
    try:  # atomic: ranks measuring at once never leave a torn file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: measure again next time
    return choice
