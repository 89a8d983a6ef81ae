"""The ranks of a sharded collection train with ONE fused CPU kernel: their trials' verdicts, pooled.

Where ``kernel_backend="auto"`` builds both fbgemm's TBE and the torch kernel over a group's storage
(``kernels/cpu_shared_lookup.py``), each rank's group times its own first training steps and picks the
faster. Every rank times the same thing -- whole steps of a lockstep loop, so each step also waits for the
slowest peer -- but each decides alone, and near the margin they split: measured on the 2-core machine
(2 gloo ranks, embedding-only DMP of ``benchmarks/bench_dmp.py``, six builds), the ranks' torch / fbgemm
ratios differed by at most 0.015, yet in 2 of 6 builds one rank kept fbgemm and the other chose torch
(0.951 / 0.944, 0.947 / 0.950 against the 0.95 margin). Split verdicts cost both: a rank running the
faster kernel waits for its peer in the next exchange.

So the collection's ranks agree. At the collection's ``TRIAL_STEPS``-th training forward -- the one in
which an uninterrupted trial decides -- every rank all-reduces, over the collection's process group, the
sum of its groups' trial step times per kernel and how many groups contributed (float64 ``[3]``:
``torch ms, fbgemm ms, groups``), and every group adopts the kernel the pooled mean times choose
(``cpu_shared_lookup.trial_kernel``: the same margin). Why this cannot hang: the count is of the
collection's own forwards, and each of them is already a collective (its input and output all-to-alls),
so every rank reaches the same count in the same forward whatever kernels or trials it holds; whether to
look again is decided from the all-reduced count, so it is the same on every rank too. Trials interrupted
often enough to start over (``StepTrial``) decide at a later multiple of ``TRIAL_STEPS``: while no rank
has a verdict the ranks look again there, up to ``TRIAL_ATTEMPTS`` times; a trial that ends off that
grid keeps its rank's own verdict.

Counted as training forwards: those with autograd on, outside inference mode and outside
``torch.use_deterministic_algorithms(True)`` -- the steps a trial records (``SharedCpuLookup.kernel_for``).
Collections off the CPU or on one rank have nothing to agree and never communicate.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.sharding_env import ShardingEnv, resolve_group
from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.kernels.cpu_shared_lookup import TRIAL_ATTEMPTS, TRIAL_STEPS, SharedCpuLookup, trial_kernel

__all__ = ["KernelAgreement"]

_TORCH, _FBGEMM = "torch", "fbgemm"


def _training_forward() -> bool:
    """Whether a forward now is a step a kernel trial records (``SharedCpuLookup.kernel_for``)."""
    return (
        torch.is_grad_enabled()
        and not torch.is_inference_mode_enabled()
        and not torch.are_deterministic_algorithms_enabled()
    )


class KernelAgreement:
    """Counts a sharded collection's training forwards and, at the trial's end, has its ranks agree on one
    fused CPU kernel (see the module docstring).

    Args:
        env: the collection's sharding environment (its process group is the one agreed over).
        device: where the collection's shards live; only ``cpu`` collections agree.
    """

    def __init__(self, env: ShardingEnv, device: torch.device) -> None:
        # The same on every rank (device type, world size and the group are), whatever kernels this rank holds.
        self._active = device.type == "cpu" and env.world_size > 1 and (env.pg is not None or dist.is_initialized())
        self._env = env
        self._forwards = 0  # training forwards so far
        self._looks = 0  # agreements tried (each at a multiple of TRIAL_STEPS)

    @property
    def settled(self) -> bool:
        """Whether the ranks are done agreeing (agreed, or looked ``TRIAL_ATTEMPTS`` times, or nothing to agree)."""
        return not self._active or self._looks >= TRIAL_ATTEMPTS

    def after_lookups(self, module: nn.Module) -> None:
        """Call once per forward of the collection ``module``, after its lookups ran: at the trial's end, the
        collective (its ``SharedCpuLookup`` kernels are found among its modules then).

        Collective on the collection's process group at those forwards: every rank must call it in every
        forward (the collection's own forwards already are collectives).
        """
        if self.settled or not _training_forward():
            return
        self._forwards += 1
        if self._forwards % TRIAL_STEPS:
            return
        self._looks += 1
        threads = torch.get_num_threads()
        lookups = [m for m in module.modules() if isinstance(m, (BatchedEmbeddingBag, BatchedEmbedding))]
        kernels = [m.kernel for m in lookups if isinstance(m.kernel, SharedCpuLookup)]
        local = [(kernel, v, v.ms) for kernel in kernels if (v := kernel.trial_verdict(threads)) is not None and v.ms]
        sums = torch.tensor([sum(ms[_TORCH] for *_, ms in local), sum(ms[_FBGEMM] for *_, ms in local), float(len(local))],
                            dtype=torch.float64)  # fmt: skip
        dist.all_reduce(sums, group=resolve_group(self._env.pg))
        groups = int(sums[2])
        if groups == 0:
            return  # no rank's trial has decided yet: look again at the next multiple (every rank does)
        self._looks = TRIAL_ATTEMPTS
        pooled = {_TORCH: float(sums[0]) / groups, _FBGEMM: float(sums[1]) / groups}
        kernel = trial_kernel(pooled)
        for lookup, verdict, ms in local:
            own = f"this rank: {verdict.kernel}, torch {ms[_TORCH]:.1f} ms, fbgemm {ms[_FBGEMM]:.1f} ms"
            detail = f"{verdict.detail}; agreed over {groups} groups on {self._env.world_size} ranks ({own})"
            lookup.adopt(threads, dataclasses.replace(verdict, kernel=kernel, ms=pooled, detail=detail))
