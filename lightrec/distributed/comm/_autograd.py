"""Asynchronous, differentiable collectives: the machinery shared by every dense collective.

A collective that must overlap with computation *and* carry gradients is split into two autograd
nodes, so that neither forward nor backward blocks earlier than it must::

    forward                                   backward (runs in reverse)
    x ──_Launch──> token (0 elements)         _Wait.backward : start the reverse collective on dy
    token ──_Wait──> y   (at .wait())         _Launch.backward: block on it, return dx

``_Launch`` starts the forward collective and returns an empty *token* tensor that only carries
the autograd edge; ``_Wait`` blocks and returns the real output. In backward the autograd engine
runs ``_Wait.backward`` first (it starts the reverse collective and returns at once) and reaches
``_Launch.backward`` only when nothing else is ready, so the reverse communication overlaps with
whatever other gradient work the graph still holds.

**Deferred input gradient** (``defer_input_grad=True``, the output dist of sharded embeddings):
the autograd engine runs the most recently created ready node first, so a plain ``_Launch.backward``
may block on the transfer before the dense layers' backward ran. In this mode ``_Launch`` hangs
off a zero-size *anchor* instead of ``x`` (``x`` goes in detached), and ``_Wait.backward`` queues
an autograd *final callback* that waits for the reverse collective and then runs the backward of
``x``'s graph (for an embedding lookup: the fused optimizer update) -- after the rest of the
backward pass, and before DDP's own final callback, which is queued later. ``x.grad`` is then set
by the time ``backward()`` returns; ``torch.autograd.grad`` cannot reach ``x`` through it.

Every rank must run the same collectives in the same order, forward *and* backward: a rank whose
output does not reach its loss skips the backward collective and the others block. Sharded modules
guarantee this by always using their outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.autograd import Function

from lightrec.distributed.comm.awaitable import LazyAwaitable

__all__ = ["Pending", "DifferentiableCollective", "CollectiveAwaitable", "GroupCollective", "group_rank_and_size", "per_rank_counts"]


def group_rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process within ``group`` (the default group when None)."""
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group(...) "
            "(or build a lightrec ShardingEnv) before using lightrec collectives"
        )
    return dist.get_rank(group), dist.get_world_size(group)



class GroupCollective:
    """Base of a collective bound to a process group: keeps the group (``_pg``; None: the default
    group) and this process's ``_rank`` and the ``_world_size`` within it.

    Args:
        pg: the process group.

    Raises:
        RuntimeError: torch.distributed is not initialized.
    """

    def __init__(self, pg: dist.ProcessGroup | None = None) -> None:
        self._pg = pg
        self._rank, self._world_size = group_rank_and_size(pg)

def per_rank_counts(values: Sequence[int], world_size: int, name: str, unit: str, what: str = "") -> list[int]:
    """``values`` as ints, checked to be ``world_size`` non-negative counts (one per rank).

    Args:
        values: the caller's argument (key counts, widths, batch sizes ... per rank).
        world_size: ranks in the group.
        name: the argument's name, for the error.
        unit: what one entry counts ("key counts", "widths"), for the error.
        what: a prefix naming the collective, for the error ("" for none).

    Raises:
        ValueError: a wrong length or a negative entry, naming the argument and its value.
    """
    counts = [int(v) for v in values]
    if len(counts) != world_size or any(c < 0 for c in counts):
        prefix = f"{what}: " if what else ""
        raise ValueError(
            f"{prefix}{name} must list {world_size} non-negative {unit} (one per rank), got {values!r}"
        )
    return counts


@dataclass
class Pending:
    """A started collective: ``work`` (None when nothing was sent) and how to build its result.

    ``keep`` holds the tensors the backend reads or writes until the work completes (the input and
    the receive buffer); they must stay alive until :meth:`result` runs.
    """

    work: dist.Work | None
    finish: Callable[[], torch.Tensor]
    keep: tuple[torch.Tensor, ...] = ()

    def result(self) -> torch.Tensor:
        """Block until the collective is done and return its output."""
        if self.work is not None:
            self.work.wait()
        out = self.finish()
        self.keep = ()
        return out


class DifferentiableCollective(Protocol):
    """A collective together with its adjoint (the collective that moves gradients back)."""

    def start_forward(self, x: torch.Tensor) -> Pending:
        """Start the collective on ``x``; return the pending result."""
        ...

    def start_backward(self, grad: torch.Tensor) -> Pending:
        """Start the adjoint collective on the output gradient (any strides: the op makes what it
        sends contiguous); return the pending input gradient."""
        ...


class _CallState:
    """Per-call state shared by the two autograd nodes of one collective."""

    __slots__ = ("op", "forward", "backward", "deferred", "deferred_input")

    def __init__(self, op: DifferentiableCollective, deferred: bool) -> None:
        self.op = op
        self.forward: Pending | None = None
        self.backward: Pending | None = None
        self.deferred = deferred  # defer_input_grad: a final callback delivers the input's gradient
        # ... by running backward through this input's graph (None once queued, or when it needs none)
        self.deferred_input: torch.Tensor | None = None


class _StateContext(Protocol):
    """What :class:`_Launch` and :class:`_Wait` leave on the autograd context: the call's state."""

    state: _CallState


class _Launch(Function):
    @staticmethod
    def forward(ctx: _StateContext, state: _CallState, edge: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # ``edge`` is the autograd input: ``x`` itself, or a zero-size anchor (deferred mode);
        # ``x`` comes in detached and is only read by the collective.
        state.forward = state.op.start_forward(x)
        ctx.state = state
        # A zero-element token: it only carries the autograd edge from the input to the output.
        return x.new_empty(0)

    @staticmethod
    def backward(ctx: _StateContext, _token_grad: torch.Tensor) -> tuple[None, torch.Tensor | None, None]:
        state: _CallState = ctx.state
        if state.deferred:
            return None, None, None  # the final callback queued by _Wait.backward delivers it
        if state.backward is None:
            raise RuntimeError("internal error: collective backward reached _Launch before _Wait")
        grad = state.backward.result()
        state.backward = None
        return None, grad, None


class _Wait(Function):
    @staticmethod
    def forward(ctx: _StateContext, state: _CallState, token: torch.Tensor) -> torch.Tensor:
        ctx.state = state
        if state.forward is None:
            raise RuntimeError("internal error: collective waited twice")
        out = state.forward.result()
        state.forward = None
        return out

    @staticmethod
    def backward(ctx: _StateContext, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        state: _CallState = ctx.state
        state.backward = state.op.start_backward(grad)
        if state.deferred:
            _queue_input_backward(state)
        return None, grad.new_empty(0)


def _queue_input_backward(state: _CallState) -> None:
    """Once this backward pass is done: wait for the reverse collective, then run the backward of
    the input's graph (see the module docstring, "Deferred input gradient")."""
    pending, deferred = state.backward, state.deferred_input
    state.backward = state.deferred_input = None  # a second backward through a retained graph: no-op
    if pending is None or deferred is None:
        return

    def finish() -> None:
        torch.autograd.backward(deferred, pending.result())

    # Runs after every other backward node of this pass (the dense layers' included).
    torch.autograd.Variable._execution_engine.queue_callback(finish)


class CollectiveAwaitable(LazyAwaitable[torch.Tensor]):
    """The output tensor of a differentiable collective that was started at construction time.

    Args:
        op: the collective and its adjoint.
        x: the input (its gradient comes back through the adjoint).
        defer_input_grad: deliver ``x``'s gradient in an autograd final callback, after the rest of
            the backward pass (see the module docstring).
    """

    def __init__(self, op: DifferentiableCollective, x: torch.Tensor, defer_input_grad: bool = False) -> None:
        super().__init__()
        self._state = _CallState(op, defer_input_grad)
        if not defer_input_grad:
            self._token = _Launch.apply(self._state, x, x.detach())
            return
        differentiable = x.requires_grad and torch.is_grad_enabled()
        anchor = torch.empty(0, device=x.device, requires_grad=differentiable)
        self._token = _Launch.apply(self._state, anchor, x.detach())
        self._state.deferred_input = x if differentiable else None

    def _wait_impl(self) -> torch.Tensor:
        out = _Wait.apply(self._state, self._token)
        self._token = None
        return out
