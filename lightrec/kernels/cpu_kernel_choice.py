"""Which kernel ``kernel_backend="auto"`` runs on CPU where fbgemm and the native torch update both serve.

fbgemm's CPU TBE (a JIT-generated row-wise update) and the torch kernel with the native fused update
(``cpu_update.py``) are close, and which one is faster depends on the processor, its caches and
memory *and on the case*: measured on the 2-core development machine, fbgemm wins one-thread,
one-id-per-bag row-wise Adagrad while the torch kernel wins elsewhere. So it is *measured per case*:
the intra-op thread count, the group's dim bucket (its largest dim rounded up to a power of two), the
optimizer and the ids per bag (bucketed to a power of two) -- a :class:`CpuKernelCase`. The kernels
are built before any batch is seen, so where the two can share a group's storage
(:func:`shared_storage_refusal`) ``"auto"`` builds both over it (``SHARED_KERNEL``,
``cpu_shared_lookup.py``) and the group runs the kernel whose whole training steps were faster over
its first 86 steps (the kernels taking turns, on the user's model and data); nothing below is
measured for such a group. Where
they cannot, the group is decided at both 1 and 32 ids per bag and the torch kernel runs only if it
wins at both; fbgemm where they disagree (the torch kernel won one-id SGD by 22 % but lost 40-id SGD
by 8 % against torchrec when the choice assumed one id). The first ``"auto"`` choice of a case
times both kernels on a small group of that shape (8 tables of ~96 MiB in all, ~16k ids, forward + backward + update,
alternating, median of thread CPU time with one thread, of wall time with more; well under a
second). The torch kernel wins only where it takes at most 85 % of fbgemm's time: fbgemm's TBE is
torchrec's own kernel, so a tie or a noisy measurement picks the kernel that cannot lose to torchrec.
The verdict is cached in ``$LIGHTREC_CACHE_DIR/cpu_kernel_choice.json`` (default
``~/.cache/lightrec``) under a key of the processor, the torch and fbgemm versions, the native
library's content (a rebuilt native update is measured again), a revision of the kernels' Python side
(``_KERNELS_REVISION``) and the case, so later processes --
every rank of later runs -- read the same answer; a measurement taken while the machine is busy
(1-minute load average above the CPU count) decides for its process only and is not cached (one
cached under load picked the torch kernel in a cell where it then lost to torchrec by 15 %).
Configurations fbgemm cannot serve (Adam, weight decay, tables shared by features, no fbgemm) use the
torch kernel without measuring.

``LIGHTREC_CPU_KERNEL=fbgemm|torch`` decides without measuring (the test suite pins ``fbgemm``;
``auto``, the default, measures). So does ``torch.use_deterministic_algorithms(True)`` (what Lightning's
``Trainer(deterministic=True)`` sets) where the switch says ``auto``: the two kernels round the same
update differently in the last bits (fbgemm's JIT update fuses multiply-adds; the torch kernel rounds as
the reference ``sparse_update`` does), so a choice made by timing would let two runs of one job differ
(measured: the DLRM recipe's test calibration 0.9915 with the torch kernel, 1.0048 with fbgemm, at equal
AUC 0.8048). Deterministic runs train with the torch kernel (:data:`DETERMINISTIC_KERNEL`), whatever
the timing, before and after a model is built. :func:`cpu_fused_choice` says which kernel serves a group and why;
:func:`cpu_kernel_lines` says it per dim bucket of a model's tables, as lines for a report.
Ranks of a first run measure independently and may choose differently; each rank's tables are its
own, so that only changes last bits (both kernels implement the same exact rule).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lightrec import _switches
from lightrec._native import native_ops
from lightrec.kernels.cpu_update import native_update_available
from lightrec.kernels.fbgemm_backend import FbgemmBatchedLookup
from lightrec.kernels.kernel_interface import EmbeddingKernel, KernelConfig, LookupBatch
from lightrec.kernels.torch_backend import TorchBatchedLookup, dim_groups
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

__all__ = ["DETERMINISTIC_KERNEL", "SHARED_KERNEL", "UNKNOWN_POOLING_CASES", "CpuKernelCase", "CpuKernelVerdict", "choose", "cpu_fused_choice", "cpu_kernel_lines",
           "cpu_kernel_verdict", "deterministic_verdict", "forget_verdicts", "machine_busy", "measure_cpu_kernels", "shared_storage_refusal",
           "verdict_for_any_pooling"]  # fmt: skip

_CHOICES = ("fbgemm", "torch")
_MEASURED_TABLES = 8
_MEASURED_BYTES = 96 << 20  # all tables of one kernel: well beyond the caches, so TLB and cache misses count
_MEASURED_IDS = 16_384  # per step, whatever the ids per bag
# fbgemm's TBE is what torchrec runs: choosing it can at most tie torchrec. The torch kernel is chosen
# only where it is clearly faster, so a close or noisy measurement cannot make lightrec lose (one
# taken under load picked torch by 34 % in a cell where it then lost 15 % end to end).
_TORCH_MARGIN = 0.85
# The ids per bag a group of unknown pooling is decided at: one-id bags (Criteo-like ids) and long bags
# (multi-hot histories), where the two kernels' costs differ most (the update's per-id vs per-row work).
UNKNOWN_POOLING_CASES = (1, 32)
# The kernel "auto" builds where fbgemm and the torch kernel can share a group's storage: both, the group
# trained by the one whose first training steps were faster (``cpu_shared_lookup.SharedCpuLookup``).
SHARED_KERNEL = "fbgemm|torch"
# The kernel of every group both kernels serve under torch.use_deterministic_algorithms(True): the torch
# kernel, whose update rounds exactly as the reference update (``sparse_update``) does.
DETERMINISTIC_KERNEL = TorchBatchedLookup.name
# fbgemm's CPU TBE optimizers, none of which reads a step counter (the two kernels keep their own).
_SHARED_OPTIMIZERS = (EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD)
# Part of the cache key: raise it when a kernel's Python side changes its speed (the native library's
# content is in the key already). 2: fbgemm's CPU storage in huge pages, the native row gather.
_KERNELS_REVISION = 2


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class CpuKernelCase:
    """What decides which fused CPU kernel is faster, as far as it is known when a kernel is built.

    Attributes:
        threads: intra-op threads (``torch.get_num_threads()`` where the kernel is built).
        dim: the group's largest embedding dim rounded up to a power of two (at least 8).
        optimizer: the fused optimizer's ``EmbOptimType`` value, e.g. ``"row_wise_adagrad"``.
        ids_per_bag: ids per bag rounded up to a power of two (1 when the caller does not know).
    """

    threads: int
    dim: int
    optimizer: str
    ids_per_bag: int = 1

    @classmethod
    def of(cls, config: KernelConfig, ids_per_bag: int | None = None) -> CpuKernelCase:
        """The case of a fused group; ``ids_per_bag`` is a pooling-factor hint (None: assume 1)."""
        if config.spec is None:
            raise ValueError("a CPU kernel case needs a fused optimizer: config.spec is None")
        if ids_per_bag is not None and ids_per_bag < 1:
            raise ValueError(f"ids_per_bag must be a positive hint or None, got {ids_per_bag}")
        return cls(
            threads=torch.get_num_threads(),
            dim=max(8, _power_of_two_at_least(max(config.dims, default=8))),
            optimizer=config.spec.optimizer.value,
            ids_per_bag=_power_of_two_at_least(ids_per_bag or 1),
        )

    def key(self) -> str:
        return f"threads={self.threads}|dim={self.dim}|{self.optimizer}|ids={self.ids_per_bag}"


@dataclasses.dataclass(frozen=True)
class CpuKernelVerdict:
    """Which kernel serves a fused CPU group (``kernel``: ``"fbgemm"`` or ``"torch"``) and why.

    Attributes:
        kernel: the kernel's name.
        reason: ``"measured"`` (now), ``"cached"`` (measured by an earlier process), ``"forced"``
            (``LIGHTREC_CPU_KERNEL``), ``"deterministic"`` (``torch.use_deterministic_algorithms``), ``"fbgemm unsupported"``, ``"no native update"``,
            ``"unknown ids per bag"`` (decided from ``parts``, one per ``UNKNOWN_POOLING_CASES``) or
            ``"timed in training"`` (``SHARED_KERNEL``: decided by a trial of the group's first training
            steps, ``cpu_shared_lookup.StepTrial``, whose verdicts say ``"trial"``).
        case: the case it was decided for (None where no measurement applies, or several did).
        ms: milliseconds per forward + backward + update of each kernel, when measured.
        detail: the words behind ``reason`` (fbgemm's refusal, the switch's value, how parts combined).
        parts: the per-pooling verdicts an ``"unknown ids per bag"`` verdict was decided from.
    """

    kernel: str
    reason: str
    case: CpuKernelCase | None = None
    ms: dict[str, float] | None = None
    detail: str = ""
    parts: tuple[CpuKernelVerdict, ...] = ()

    def describe(self) -> str:
        """One line, e.g. ``fbgemm: measured fbgemm 9.1 ms, torch 11.8 ms (threads=1|dim=64|...)``;
        a verdict from parts lists each part after ``;``."""
        text = f"{self.kernel}: {self.reason}"
        if self.ms:
            text += " " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(self.ms.items()))
        if self.detail:
            text += f" ({self.detail})"
        text += "".join(f"; ids={part.case.ids_per_bag if part.case else '?'} -> {part.describe()}" for part in self.parts)
        return text + (f" [{self.case.key()}]" if self.case is not None else "")


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
    return f"{model}|{os.cpu_count()}|torch {torch.__version__}|fbgemm {fbgemm}|{library}|kernels r{_KERNELS_REVISION}"


def measure_cpu_kernels(case: CpuKernelCase | None = None, iterations: int = 5) -> dict[str, float]:
    """Median milliseconds of one forward + backward + fused update per kernel, for ``case``.

    Args:
        case: the shape to time (default: this process's threads, dim 64, row-wise Adagrad, one id
            per bag). 8 tables of ``case.dim`` with ~96 MiB of rows in all, ~16k ids per step in
            bags of ``case.ids_per_bag``.
        iterations: timed rounds after two warm-up rounds; the kernels alternate which goes first.

    Returns:
        ``{"fbgemm": ms, "torch": ms}``: thread CPU time with one intra-op thread (robust to other
        load), wall time with more (the threads' parallelism is what is compared).
    """
    case = case or CpuKernelCase(torch.get_num_threads(), 64, EmbOptimType.ROWWISE_ADAGRAD.value)
    tables, dim, ids = _MEASURED_TABLES, case.dim, case.ids_per_bag
    rows = max(1024, _MEASURED_BYTES // (tables * dim * 4))
    batch = max(16, _MEASURED_IDS // (tables * ids))
    spec = FusedOptimizerSpec(EmbOptimType.coerce(case.optimizer), learning_rate=0.01)
    gen = torch.Generator().manual_seed(0)
    lookup = LookupBatch(
        torch.randint(0, rows, (tables * batch * ids,), generator=gen),
        torch.arange(0, tables * batch * ids + 1, ids),
        None,
        batch,
    )
    grad = torch.randn(batch, tables * dim, generator=gen)
    config = KernelConfig([rows] * tables, [dim] * tables, list(range(tables)), PoolingType.SUM, spec,
                          torch.device("cpu"))  # fmt: skip
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(case.threads)
    clock = time.thread_time if case.threads == 1 else time.perf_counter
    try:
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
                start = clock()
                kernel.lookup(lookup, [anchor], lambda: 0.01).backward(grad)
                if i >= 2:  # two warm-up rounds
                    times[name].append(1000.0 * (clock() - start))
    finally:
        torch.set_num_threads(saved_threads)
    return {name: statistics.median(t) for name, t in times.items()}


def machine_busy() -> bool:
    """Whether other work competes for the cores now (1-minute load average above the CPU count):
    a measurement taken then decides for this process only and is not cached."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return False


def choose(ms: dict[str, float]) -> str:
    """The kernel for measured times: torch only where it takes at most ``_TORCH_MARGIN`` of fbgemm's."""
    return "torch" if ms["torch"] <= _TORCH_MARGIN * ms["fbgemm"] else "fbgemm"


def _read_cache(path: Path) -> dict[str, object]:
    """The cache file's entries; an unreadable or corrupt file is an empty cache (measured again)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def _forced_verdict(case: CpuKernelCase | None) -> CpuKernelVerdict | None:
    """The verdict ``LIGHTREC_CPU_KERNEL`` forces, or None when it says ``auto`` (measure).

    Raises:
        lightrec._switches.SwitchError: the switch holds a word it does not know.
    """
    forced = _switches.CPU_KERNEL.read()  # SwitchError (a ValueError) on a word it does not know
    if forced == "auto":
        return None
    return CpuKernelVerdict(forced, "forced", case, detail=f"LIGHTREC_CPU_KERNEL={forced}")


def deterministic_verdict(case: CpuKernelCase | None) -> CpuKernelVerdict | None:
    """The verdict where ``torch.use_deterministic_algorithms(True)`` rules out a choice by timing
    (:data:`DETERMINISTIC_KERNEL`), or None where it is off."""
    if not torch.are_deterministic_algorithms_enabled():
        return None
    return CpuKernelVerdict(DETERMINISTIC_KERNEL, "deterministic", case, detail=(
        "torch.use_deterministic_algorithms(True): no timing decides; the torch kernel rounds as the reference does"))  # fmt: skip


def cpu_kernel_verdict(case: CpuKernelCase) -> CpuKernelVerdict:
    """The faster fused CPU kernel for ``case`` on this machine: forced, cached, or measured now.

    ``LIGHTREC_CPU_KERNEL`` is read at every call (a process may build models under several settings);
    otherwise decided once per case and process (:func:`forget_verdicts` forgets that).

    Raises:
        lightrec._switches.SwitchError: ``LIGHTREC_CPU_KERNEL`` holds a word it does not know.
    """
    forced = _forced_verdict(case)
    return forced if forced is not None else _decided_verdict(case)


def forget_verdicts() -> None:
    """Forget the verdicts this process decided (measured, or read from the cache file): the next are decided again."""
    _decided_verdict.cache_clear()


@functools.cache
def _decided_verdict(case: CpuKernelCase) -> CpuKernelVerdict:
    """:func:`cpu_kernel_verdict` where the switch says ``auto``: the cache file's, or measured now (once per case)."""
    key = f"{_machine_key()}|{case.key()}"
    path = _cache_file()
    cached = _read_cache(path)
    entry = cached.get(key)
    if isinstance(entry, dict) and entry.get("choice") in _CHOICES:
        ms = entry.get("ms")
        times = {str(k): float(v) for k, v in ms.items() if isinstance(v, (int, float))} if isinstance(ms, dict) else {}
        return CpuKernelVerdict(str(entry["choice"]), "cached", case, times or None)
    busy = machine_busy()
    ms = measure_cpu_kernels(case)
    choice = choose(ms)
    if busy or machine_busy():
        return CpuKernelVerdict(choice, "measured", case, ms, detail="machine busy: not cached")
    cached = _read_cache(path)  # again: another process may have added its cases meanwhile
    cached[key] = {"choice": choice, "ms": ms}
    try:  # atomic: ranks measuring at once never leave a torn file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: measure again next time
    return CpuKernelVerdict(choice, "measured", case, ms)


def verdict_for_any_pooling(parts: Sequence[CpuKernelVerdict]) -> CpuKernelVerdict:
    """One verdict for a group whose ids per bag are unknown, from its verdicts at each of
    ``UNKNOWN_POOLING_CASES``: the kernel all of them chose, else fbgemm (torchrec's kernel: it
    cannot lose to torchrec whichever pooling the data has). A forced verdict stays forced, without
    a case (the switch decides every case alike).

    Raises:
        ValueError: ``parts`` is empty.
    """
    if not parts:
        raise ValueError("verdict_for_any_pooling needs at least one per-pooling verdict, got none")
    if parts[0].reason == "forced":
        return dataclasses.replace(parts[0], case=None)
    kernels = {part.kernel for part in parts}
    pooled = " and ".join(str(part.case.ids_per_bag) for part in parts if part.case is not None)
    if len(kernels) == 1:
        kernel, detail = parts[0].kernel, f"{parts[0].kernel} at {pooled} ids per bag"
    else:
        kernel, detail = FbgemmBatchedLookup.name, f"{pooled} ids per bag disagree: fbgemm, which cannot lose to torchrec"
    return CpuKernelVerdict(kernel, "unknown ids per bag", detail=detail, parts=tuple(parts))


def shared_storage_refusal(config: KernelConfig) -> str | None:
    """None where the torch kernel can serve fbgemm's CPU storage of ``config`` in place (so one group
    can train with either: ``cpu_shared_lookup.py``), else why not. fbgemm lays tables out
    back to back in table order, the torch kernel one ``[R, D]`` tensor per dim: the tables of each dim
    must be adjacent."""
    if config.device.type != "cpu" or config.tiering is not None:
        return "shared storage is for in-memory CPU tables"
    if config.spec is None or config.spec.optimizer not in _SHARED_OPTIMIZERS:
        return f"shared storage needs one of fbgemm's CPU optimizers {[o.name for o in _SHARED_OPTIMIZERS]}"
    if not native_update_available(config.device, config.dtype):
        return "the torch kernel's native CPU update does not serve these tables here"
    for dim, tables in dim_groups(config.dims):
        if tables != list(range(tables[0], tables[0] + len(tables))):
            return f"the tables of dim {dim} ({tables}) are not adjacent in table order"
    return None


def cpu_fused_choice(config: KernelConfig, ids_per_bag: int | None = None) -> CpuKernelVerdict:
    """Which of fbgemm and the torch kernel ``kernel_backend="auto"`` runs for a fused CPU group, and why.

    Args:
        config: the group (``config.spec`` set: a fused optimizer).
        ids_per_bag: a pooling-factor hint for the case. None (unknown): where the two kernels can
            share the storage (:func:`shared_storage_refusal`), both, the group trained by the faster
            over its first training steps (``SHARED_KERNEL``, reason ``"timed in training"``, nothing
            measured now); else decided at each of ``UNKNOWN_POOLING_CASES`` by
            :func:`verdict_for_any_pooling`.

    ``LIGHTREC_CPU_KERNEL`` decides first, then ``torch.use_deterministic_algorithms(True)``
    (:func:`deterministic_verdict`), then a measurement or the trial.

    Raises:
        ValueError: ``config`` has no fused optimizer.
    """
    if config.spec is None:
        raise ValueError("cpu_fused_choice decides between fused kernels: config.spec is None")
    refusal = FbgemmBatchedLookup.supports(config)
    if refusal is not None:
        return CpuKernelVerdict(TorchBatchedLookup.name, "fbgemm unsupported", detail=refusal)
    if not native_update_available(config.device, config.dtype):
        return CpuKernelVerdict(FbgemmBatchedLookup.name, "no native update",
                                detail="the torch kernel's native CPU update does not serve these tables here")  # fmt: skip
    case = None if ids_per_bag is None else CpuKernelCase.of(config, ids_per_bag)
    if _forced_verdict(case) is None:  # the switch first: it may pin fbgemm in a deterministic run
        deterministic = deterministic_verdict(case)
        if deterministic is not None:
            return deterministic
    if case is not None:
        return cpu_kernel_verdict(case)
    if _forced_verdict(None) is None and shared_storage_refusal(config) is None:
        return CpuKernelVerdict(SHARED_KERNEL, "timed in training", detail=(
            "both kernels over one storage; the group runs the faster over its first 86 training steps, "
            "timed whole with the kernels alternating"))  # fmt: skip
    return verdict_for_any_pooling([cpu_kernel_verdict(CpuKernelCase.of(config, n)) for n in UNKNOWN_POOLING_CASES])


def cpu_kernel_lines(dims: Sequence[int], spec: FusedOptimizerSpec) -> list[str]:
    """What ``kernel_backend="auto"`` runs on CPU for fused tables of these ``dims``, one line per dim
    bucket (a group of mixed dims takes its largest dim's verdict), for a report.

    A group both kernels can serve is decided as it trains (``"timed in training"``), so nothing is
    measured for it here; other groups' cases not cached yet are measured (well under a second each),
    with this process's threads, at each of ``UNKNOWN_POOLING_CASES``.
    """
    lines = []
    for bucket in sorted({max(8, _power_of_two_at_least(d)) for d in dims}):
        tables = sum(max(8, _power_of_two_at_least(d)) == bucket for d in dims)
        config = KernelConfig([1024], [bucket], [0], PoolingType.SUM, spec, torch.device("cpu"))
        lines.append(f"  dim <= {bucket} ({tables} tables): {cpu_fused_choice(config).describe()}")
    return lines
