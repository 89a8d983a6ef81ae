"""Per-phase wall time of a sharded training step, for lightrec and torchrec alike (``bench_dmp.py``).

The same phases for both libraries, measured on the training thread by wrapping the functions
that do each phase's work (the wrappers only time while a :class:`PhaseClock` is enabled), and by
the step itself (:meth:`PhaseClock.phase`, :meth:`PhaseClock.backward`) for the dense phases:

================  ============================================  ==============================================
phase             lightrec                                      torchrec 1.8
================  ============================================  ==============================================
input_dist        ``ShardedCollectionBase.input_dist`` and the  ``ShardedEmbeddingBagCollection.input_dist``
                  KJT all-to-all's two awaitables' waits        and its KJT / splits awaitables' waits
lookup            ``GroupedPooledEmbeddingsLookup.forward``     ``GroupedPooledEmbeddingsLookup.forward``
output_dist_fwd   the pooled all-to-all's start and result      ``PooledEmbeddingsAllToAll.forward`` + wait
output_dist_bwd   its backward start and result                 ``All2All_Pooled_Req/Wait.backward``
update            the backward node of each kernel's output     the backward node of each TBE's output
                  (the fused optimizer)                         (the fused optimizer)
dense_fwd         the rest of the model's forward and the loss (dense layers, interaction)
dense_bwd         the rest of ``loss.backward()`` up to its last backward node (dense layers' backward; DDP
                  launching its bucket all-reduces)
dense_allreduce   what ``loss.backward()`` waits after its last node: DDP finishing the all-reduces that ran
                  beside the backward (lightrec: its shared-memory thread, torchrec: gloo's), the part not
                  hidden under it, less the nested phases above
optimizer         ``zero_grad`` and ``step`` of the combined optimizer (the dense one; the fused update is in
                  ``update``)
other             the rest of the step (Python, batch selection)
================  ============================================  ==============================================

Time is *exclusive*: a phase entered inside another (lightrec runs the update inside the output
dist's deferred backward) pauses the outer one, so the phases add up to the step. Waiting for a
peer counts in the phase that waits.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["PHASES", "PhaseClock", "install"]

PHASES = ("input_dist", "lookup", "output_dist_fwd", "output_dist_bwd", "update",
          "dense_fwd", "dense_bwd", "dense_allreduce", "optimizer", "other")  # fmt: skip


class PhaseClock:
    """Accumulates exclusive wall time per phase while ``enabled``."""

    def __init__(self) -> None:
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []

    def enter(self, name: str) -> None:
        now = time.perf_counter()
        if self._stack:
            self.totals[self._stack[-1][0]] += now - self._stack[-1][1]
        self._stack.append([name, now])

    def exit(self) -> None:
        if not self._stack:
            return
        now = time.perf_counter()
        name, start = self._stack.pop()
        self.totals[name] += now - start
        if self._stack:
            self._stack[-1][1] = now

    def reset(self) -> None:
        self.totals.clear()
        self._stack.clear()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (exclusive of the phases entered inside it) while enabled."""
        if not self.enabled:
            yield
            return
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` as ``dense_bwd`` up to its last backward node, then ``dense_allreduce``:
        an autograd callback queued by the first node runs before DDP's (queued when its first bucket
        is ready), so what follows it is DDP's wait for its all-reduces (and lightrec's deferred
        embedding backward, whose phases are timed on their own)."""
        if not self.enabled or loss.grad_fn is None:
            loss.backward()
            return
        engine = torch.autograd.Variable._execution_engine

        def tail() -> None:
            self.exit()  # dense_bwd
            self.enter("dense_allreduce")

        loss.grad_fn.register_prehook(lambda grads: engine.queue_callback(tail))
        self.enter("dense_bwd")
        try:
            loss.backward()
        finally:
            self.exit()

    def per_step_ms(self, step_seconds: float, steps: int) -> dict[str, float]:
        """``{phase: ms per step}``; ``other`` is the step's time not spent in the other phases."""
        out = {p: 1000.0 * self.totals.get(p, 0.0) / steps for p in PHASES if p != "other"}
        out["other"] = 1000.0 * step_seconds / steps - sum(out.values())
        out["step"] = 1000.0 * step_seconds / steps
        return out


def _timed(clock: PhaseClock, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not clock.enabled:
            return fn(*args, **kwargs)
        clock.enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            clock.exit()

    return wrapper


def _patch(clock: PhaseClock, module: str, qualname: str, phase: str) -> None:
    owner_name, attr = qualname.rsplit(".", 1)
    owner: Any = importlib.import_module(module)
    for part in owner_name.split("."):
        owner = getattr(owner, part)
    raw = inspect.getattr_static(owner, attr)  # inherited methods too; set on ``owner`` below
    if isinstance(raw, staticmethod):
        setattr(owner, attr, staticmethod(_timed(clock, phase, raw.__func__)))
    else:
        setattr(owner, attr, _timed(clock, phase, raw))


def _hook_update(clock: PhaseClock, module: str, qualname: str) -> None:
    """Time the backward node of what ``qualname`` returns (a kernel's output: its fused update)."""
    owner_name, attr = qualname.rsplit(".", 1)
    owner = getattr(importlib.import_module(module), owner_name)
    fn = inspect.getattr_static(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        node = getattr(out, "grad_fn", None)
        if clock.enabled and isinstance(out, torch.Tensor) and node is not None:
            node.register_prehook(lambda grads: clock.enter("update") if clock.enabled else None)
            node.register_hook(lambda grads_in, grads_out: clock.exit() if clock.enabled else None)
        return out

    setattr(owner, attr, wrapper)


def _tag_pending(clock: PhaseClock, module: str, qualname: str, phase: str) -> None:
    """Wrap a ``start_*`` of lightrec's collectives: time it, and tag the ``Pending`` it returns so
    its ``result()`` counts in the same phase."""
    owner_name, attr = qualname.rsplit(".", 1)
    owner = getattr(importlib.import_module(module), owner_name)
    timed = _timed(clock, phase, inspect.getattr_static(owner, attr))

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        pending = timed(*args, **kwargs)
        pending.phase = phase
        return pending

    setattr(owner, attr, wrapper)


def install(clock: PhaseClock, library: str) -> None:
    """Wrap ``library``'s (``"lightrec"`` or ``"torchrec"``) phase functions to report to ``clock``."""
    if library == "lightrec":
        for qualname in ("ShardedCollectionBase.input_dist",):
            _patch(clock, "lightrec.distributed.sharding.collection", qualname, "input_dist")
        for qualname in ("KJTAllToAllSplitsAwaitable._wait_impl", "KJTAllToAllTensorsAwaitable._wait_impl"):
            _patch(clock, "lightrec.distributed.comm.kjt_all_to_all", qualname, "input_dist")
        _patch(
            clock, "lightrec.distributed.sharding.lookups", "GroupedPooledEmbeddingsLookup.forward", "lookup"
        )
        _tag_pending(clock, "lightrec.distributed.comm.pooled_all_to_all", "_PooledAllToAllOp.start_forward",
                     "output_dist_fwd")  # fmt: skip
        _tag_pending(clock, "lightrec.distributed.comm.pooled_all_to_all", "_PooledAllToAllOp.start_backward",
                     "output_dist_bwd")  # fmt: skip
        autograd = importlib.import_module("lightrec.distributed.comm._autograd")
        result = autograd.Pending.result

        def timed_result(self: Any) -> Any:
            phase = getattr(self, "phase", None)
            if phase is None or not clock.enabled:
                return result(self)
            clock.enter(phase)
            try:
                return result(self)
            finally:
                clock.exit()

        autograd.Pending.result = timed_result
        _hook_update(clock, "lightrec.kernels.torch_backend", "TorchBatchedLookup.lookup")
        _hook_update(clock, "lightrec.kernels.fbgemm_backend", "FbgemmBatchedLookup.lookup")
        return
    dist_data = "torchrec.distributed.dist_data"
    _patch(
        clock, "torchrec.distributed.embeddingbag", "ShardedEmbeddingBagCollection.input_dist", "input_dist"
    )
    for qualname in ("KJTAllToAllSplitsAwaitable._wait_impl", "KJTAllToAllTensorsAwaitable._wait_impl",
                     "SplitsAllToAllAwaitable._wait_impl"):  # fmt: skip
        _patch(clock, dist_data, qualname, "input_dist")
    _patch(clock, "torchrec.distributed.embedding_lookup", "GroupedPooledEmbeddingsLookup.forward", "lookup")
    _patch(clock, dist_data, "PooledEmbeddingsAllToAll.forward", "output_dist_fwd")
    _patch(clock, dist_data, "PooledEmbeddingsAwaitable._wait_impl", "output_dist_fwd")
    for qualname in ("All2All_Pooled_Req.backward", "All2All_Pooled_Wait.backward"):
        _patch(clock, "torchrec.distributed.comm_ops", qualname, "output_dist_bwd")
    _hook_update(clock, "torchrec.distributed.batched_embedding_kernel", "BatchedFusedEmbeddingBag.forward")
