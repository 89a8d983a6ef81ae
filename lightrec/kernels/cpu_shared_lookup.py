"""fbgemm's CPU TBE and the torch kernel over ONE storage: a group trains with whichever is faster on its own steps.

Which fused CPU kernel is faster depends on the ids per bag (``cpu_kernel_choice.py``): measured on the
2-core development machine, the torch kernel's native update wins one-id bags by 20-30 % while fbgemm's
TBE wins 32-id row-wise Adagrad by 30-70 %. A kernel built before any batch is seen cannot know which
case it will serve, so ``kernel_backend="auto"`` builds both over the same tables::

    fbgemm TBE  weights_host  [sum_t rows_t * D]   momentum1_host [sum_t rows_t] (row-wise)
                   |  views, never copies                 |
    torch kernel   weight [R, D] per dim group     states {"momentum1": [R]}

and the group's first 86 training steps (at each intra-op thread count) are its *trial*
(:class:`StepTrial`), on the user's own model and data: after 3 untimed warm-up steps each, the kernels
take turns in blocks of 5 steps (torch, fbgemm, fbgemm, torch, four times) and the whole step is timed, from
one lookup to the next (the model's dense work, the exchanges between ranks and the data included, as
the user will feel it); the torch kernel serves the group from then on only where its second-fastest
step takes at most 95 % of fbgemm's (fbgemm is torchrec's kernel: a tie cannot make lightrec lose to
torchrec). A synthetic measurement could not do this: on the 2-core
development machine it timed the one-id row-wise Adagrad case a tie, where the torch kernel's whole
training step is 10 % faster. Both kernels implement the same exact update rule and write the same rows
in place, so switching between batches changes nothing but last bits. Forward-only calls (evaluation,
``no_grad``) run fbgemm's lookup. The verdicts are logged (``logging.INFO``) and kept in
:attr:`SharedCpuLookup.verdicts`. Under ``torch.use_deterministic_algorithms(True)`` (Lightning's
``Trainer(deterministic=True)``, checked at every training step: it may be set after the model is built)
there is no trial: every training step runs ``cpu_kernel_choice.DETERMINISTIC_KERNEL``, so two runs of
one job train bit for bit alike.

The torch kernel can serve fbgemm's storage where the tables of each dim are adjacent in fbgemm's
table order (:func:`shared_storage_refusal`; one dim is the common case), and the optimizer is one
fbgemm's CPU TBE runs (SGD, Adagrad, row-wise Adagrad: none reads a step counter).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from lightrec.kernels.cpu_kernel_choice import (
    DETERMINISTIC_KERNEL,
    SHARED_KERNEL,
    CpuKernelCase,
    CpuKernelVerdict,
    deterministic_verdict,
    shared_storage_refusal,
)
from lightrec.kernels.fbgemm_backend import FbgemmBatchedLookup
from lightrec.kernels.kernel_interface import EmbeddingKernel, KernelConfig, LookupBatch
from lightrec.kernels.torch_backend import TorchBatchedLookup, dim_groups
from lightrec.modules.embedding_configs import PoolingType

__all__ = ["TRIAL_ATTEMPTS", "TRIAL_STEPS", "SharedCpuLookup", "StepTrial", "trial_kernel"]

_log = logging.getLogger(__name__)


def _joined(parts: Sequence[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor | None:
    """One ``shape`` view spanning ``parts`` (per-table views of one buffer), or None where they are not
    contiguous and back to back in memory (the torch kernel then cannot serve them as one tensor)."""
    if not parts or any(not p.is_contiguous() for p in parts) or sum(p.numel() for p in parts) != math.prod(shape):
        return None
    for before, after in zip(parts, parts[1:]):
        if after.data_ptr() != before.data_ptr() + before.numel() * before.element_size():
            return None
    first = parts[0].detach()
    return first.as_strided((math.prod(shape),), (1,), first.storage_offset()).view(shape)


# A trial: a few untimed warm-up steps per kernel, then blocks of consecutive training steps per kernel in
# the order torch, fbgemm, fbgemm, torch, four times (a drift of the machine's speed during the trial weighs on
# both alike). Only steps inside a block are timed (the step before and after ran the same kernel), so a
# pipeline that starts the next batch's lookup before the current backward still times one kernel's work.
# Why the warm-up: a kernel's first steps pay its page faults, its allocator's growth and its thread-local
# tables; measured (26 x 100k x 64, one id per bag, one thread) the torch kernel's steps 2-4 took 19-30 ms
# against 10-11 ms a block later, and a trial that timed them kept fbgemm in 3 runs of 4.
# Why the second-fastest of each kernel's timed steps (not the median, nor the lower quartile): on a shared
# machine many steps take longer than the work in them (another job, a slow phase of a VM's memory, glibc
# returning and re-faulting a 13.6 MB buffer: 3,300 minor faults, ~5 ms), and nothing makes a step faster
# than its work, so the fastest steps measure the kernel and the rest measure the machine. Measured in the
# single-process fused benchmark (26 x 100k x 64, one id per bag, one thread; 10 trials, 2026-11-30): block
# medians inside one trial moved between 9.5 and 20 ms, the median kept fbgemm in 4 of 10, the lower quartile
# in 3 of 10 (torch / fbgemm 0.86-1.01), the second-fastest step in none (0.837-0.947), while the torch
# kernel's undisturbed step is ~10 % faster; at 8 and 40 ids per bag, where fbgemm is 25-70 % faster, every
# estimate kept fbgemm. Second, not first: one step that happened to get a lighter batch (jagged ids) is
# not the kernel's speed.
# Why four rounds of blocks (86 steps, ~1 s at 10 ms a step) and not two (46): a slow phase of the machine
# can cover a whole block, and with two rounds one kernel's fast steps sometimes all fell into one: in the
# single-process benchmark the 46-step trial still kept fbgemm in 2 of 8 runs (lightrec 1.15x and 1.17x
# torchrec's rate, against 1.10-1.34x with torch), the 86-step one kept torch in 9 of 9 (1.23-1.41x, and
# 1.04x once in a slow phase of the VM).
_TRIAL_BLOCK = 5
_TRIAL_WARM = 3
_TORCH, _FBGEMM = TorchBatchedLookup.name, FbgemmBatchedLookup.name
_TRIAL_BLOCKS = (_TORCH, _FBGEMM, _FBGEMM, _TORCH) * 4
_TRIAL_SCHEDULE = (_TORCH,) * _TRIAL_WARM + (_FBGEMM,) * _TRIAL_WARM + tuple(
    kernel for kernel in _TRIAL_BLOCKS for _ in range(_TRIAL_BLOCK)
)
_TRIAL_TIMED_FROM = 2 * _TRIAL_WARM  # the first step that may be timed
TRIAL_STEPS = len(_TRIAL_SCHEDULE)
"""Training steps of one trial schedule: an uninterrupted trial's verdict comes with its ``TRIAL_STEPS``-th step."""
# fbgemm is torchrec's kernel, so it cannot lose to torchrec: the torch kernel must be clearly faster.
_TRIAL_MARGIN = 0.95
# A loop that never runs three training steps in a row (an evaluation forward after every step, an intra-op
# thread count changed at every step) leaves nothing to time: after this many schedules fbgemm serves.
TRIAL_ATTEMPTS = 3
_clock = time.perf_counter  # whole steps, every thread's work and the waits between ranks included


def trial_kernel(ms: dict[str, float]) -> str:
    """The kernel a trial's step times choose: torch only where it takes at most ``_TRIAL_MARGIN`` of fbgemm's."""
    return _TORCH if ms[_TORCH] <= _TRIAL_MARGIN * ms[_FBGEMM] else _FBGEMM


def _second_fastest(values: Sequence[float]) -> float:
    """The second-smallest of ``values`` (the smallest of fewer than 2)."""
    ordered = sorted(values)
    return ordered[min(1, len(ordered) - 1)]


@dataclasses.dataclass
class StepTrial:
    """The timing of a group's first training steps at one thread count, run by the kernels in turn
    (``_TRIAL_SCHEDULE``).

    Attributes:
        steps: ``(call index, clock, kernel, ids per bag)`` of each recorded step, in order.
    """

    steps: list[tuple[int, float, str, float]] = dataclasses.field(default_factory=list)
    attempts: int = 0
    """Schedules run to the end that left too few timed steps (each starts the schedule again)."""

    def record(self, call: int, now: float, ids_per_bag: float) -> str:
        """Record a step starting now (``call``: the group's lookup count) and return the kernel to run it."""
        kernel = _TRIAL_SCHEDULE[min(len(self.steps), len(_TRIAL_SCHEDULE) - 1)]
        self.steps.append((call, now, kernel, ids_per_bag))
        return kernel

    def step_ms(self) -> dict[str, list[float]]:
        """Per kernel, the milliseconds of each step timed: a step past the warm-up whose neighbours ran
        the same kernel and directly follow it (no evaluation call in between)."""
        times: dict[str, list[float]] = {_TORCH: [], _FBGEMM: []}
        for index in range(max(1, _TRIAL_TIMED_FROM), len(self.steps) - 1):
            before, this, after = self.steps[index - 1 : index + 2]
            consecutive = this[0] == before[0] + 1 and after[0] == this[0] + 1
            if consecutive and before[2] == this[2] == after[2]:
                times[this[2]].append(1000.0 * (after[1] - this[1]))
        return times

    def verdict(self, config: KernelConfig) -> CpuKernelVerdict | None:
        """The kernel for the group ``config`` once the schedule has run, else None. Steps interrupted
        too often to time three of each kernel start the schedule again; after ``TRIAL_ATTEMPTS`` such
        schedules fbgemm serves (nothing could be timed: torchrec's kernel, which cannot lose to torchrec)."""
        if len(self.steps) < len(_TRIAL_SCHEDULE):
            return None
        times = self.step_ms()
        if min(len(t) for t in times.values()) < 3:
            self.attempts += 1
            if self.attempts >= TRIAL_ATTEMPTS:
                detail = (f"{self.attempts} schedules of {len(_TRIAL_SCHEDULE)} steps left fewer than 3 timed steps of "
                          "a kernel (never 3 training steps in a row): fbgemm, torchrec's kernel")  # fmt: skip
                return CpuKernelVerdict(_FBGEMM, "trial", CpuKernelCase.of(config), None, detail)
            self.steps.clear()
            return None
        ms = {name: _second_fastest(t) for name, t in times.items()}
        kernel = trial_kernel(ms)
        ids_per_bag = statistics.fmean(step[3] for step in self.steps)
        detail = (f"second-fastest training step, {len(self.steps)} steps ({_TRIAL_TIMED_FROM} warm-up) alternating "
                  f"in blocks of {_TRIAL_BLOCK}, {ids_per_bag:.1f} ids per bag")  # fmt: skip
        return CpuKernelVerdict(kernel, "trial", CpuKernelCase.of(config, max(1, round(ids_per_bag))), ms, detail)


class SharedCpuLookup(FbgemmBatchedLookup):
    """fbgemm's CPU TBE plus a torch kernel over its storage; after a trial of the first training steps
    the group trains with the faster one (an ``EmbeddingKernel``; see the module docstring).

    Args:
        config: a fused CPU group both kernels serve (:func:`shared_storage_refusal` is None).

    Raises:
        ValueError: ``config`` is not such a group.
    """

    name: ClassVar[str] = SHARED_KERNEL
    wants_singletons: ClassVar[bool] = True  # the torch kernel's one-id-per-bag path reads the hint

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        return FbgemmBatchedLookup.supports(config) or shared_storage_refusal(config)

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)  # refuses what :meth:`supports` turns down
        self._config = config
        storage = self._fbgemm_storage(config)
        # None: fbgemm laid its tables out otherwise than this module reads them; it serves alone then.
        self.torch_kernel = None if storage is None else TorchBatchedLookup(config, storage=storage)
        if self.torch_kernel is None:
            _log.warning("fbgemm's CPU storage is not laid out as expected: kernel %r runs fbgemm only", self.name)
        self._calls = 0  # lookups so far: a trial times only steps that follow each other
        self._trials: dict[int, StepTrial] = {}
        self._deterministic_logged = False
        self.verdicts: dict[int, CpuKernelVerdict] = {}
        """Per intra-op thread count, the kernel its trial chose (reason ``"trial"``, second-fastest step times)."""

    def _fbgemm_storage(self, config: KernelConfig) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]] | None:
        """Per dim group, views of fbgemm's weights and optimizer state shaped as the torch kernel's storage."""
        spec = self._fused
        weights, states = self.split_embedding_weights(), self.split_optimizer_states()
        storage = []
        for dim, tables in dim_groups(config.dims):
            total = sum(config.rows[t] for t in tables)
            weight = _joined([weights[t] for t in tables], (total, dim))
            if weight is None:
                return None
            group_states: dict[str, torch.Tensor] = {}
            for state in spec.state_names:
                shape = spec.state_shape(state, total, dim)
                parts = [states[t][state] for t in tables]
                joined = _joined([p.reshape(spec.state_shape(state, p.shape[0], dim)) for p in parts], shape)
                if joined is None:
                    return None
                group_states[state] = joined
            storage.append((weight, group_states))
        return storage

    def kernel_for(self, batch: LookupBatch) -> EmbeddingKernel:
        """The kernel that runs ``batch``, recording the step while the trial of this thread count runs;
        fbgemm for a forward without autograd (nothing to update; it also breaks the run of consecutive
        training steps a trial times)."""
        self._calls += 1
        if self.torch_kernel is None or not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return self
        if torch.are_deterministic_algorithms_enabled():  # a choice by timing could differ between runs
            verdict = None if self._deterministic_logged else deterministic_verdict(CpuKernelCase.of(self._config))
            if verdict is not None:
                self._deterministic_logged = True
                _log.info("kernel %r, tables %s: %s", self.name, list(self._config.table_names), verdict.describe())
            return self.torch_kernel if DETERMINISTIC_KERNEL == _TORCH else self
        threads = torch.get_num_threads()
        verdict = self.verdicts.get(threads)
        if verdict is None:
            trial = self._trials.setdefault(threads, StepTrial())
            ids_per_bag = 1.0 if self.pooling == PoolingType.NONE else batch.indices.numel() / max(1, batch.offsets.numel() - 1)
            kernel_name = trial.record(self._calls, _clock(), ids_per_bag)
            verdict = trial.verdict(self._config)
            if verdict is None:
                return self.torch_kernel if kernel_name == _TORCH else self
            self.verdicts[threads] = verdict
            del self._trials[threads]
            _log.info("kernel %r, tables %s: %s", self.name, list(self._config.table_names), verdict.describe())
        return self.torch_kernel if verdict.kernel == _TORCH else self

    def trial_verdict(self, threads: int) -> CpuKernelVerdict | None:
        """The verdict the trial at ``threads`` intra-op threads reached, with its step times; None while it
        runs (or where no trial decided: deterministic runs, fbgemm alone)."""
        verdict = self.verdicts.get(threads)
        return verdict if verdict is not None and verdict.reason == "trial" and verdict.ms else None

    def adopt(self, threads: int, verdict: CpuKernelVerdict) -> None:
        """Train at ``threads`` intra-op threads with ``verdict``'s kernel from the next step on (the ranks of
        a sharded collection agree on one, ``distributed/sharding/kernel_agreement.py``).

        Raises:
            ValueError: ``verdict`` names neither of this group's kernels.
        """
        if verdict.kernel not in (_TORCH, _FBGEMM):
            raise ValueError(f"verdict.kernel must be {_TORCH!r} or {_FBGEMM!r}, got {verdict.kernel!r}")
        self._trials.pop(threads, None)
        self.verdicts[threads] = verdict
        _log.info("kernel %r, tables %s: %s", self.name, list(self._config.table_names), verdict.describe())

    def lookup(
        self, lookup_batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]
    ) -> torch.Tensor:
        """Pooled ``[B, sum D]`` or unpooled ``[N, D]`` output of the kernel :meth:`kernel_for` picks;
        its backward is that kernel's fused update of the shared rows."""
        kernel = self.kernel_for(lookup_batch)
        if kernel is self:
            return super().lookup(lookup_batch, weight_inputs, lr)
        return kernel.lookup(lookup_batch, weight_inputs, lr)
