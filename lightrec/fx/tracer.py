"""``torch.fx`` tracing for inference models (the TorchRec tutorial's ``torchrec.fx.Tracer``).

Batched-kernel modules are kept as leaves (one ``call_module`` node each) so that their
Python-side bookkeeping is not traced and ``torch.jit.script`` compiles them from their own
source. lightrec's sparse types trace as values (their constructors become graph nodes), and the
kernels' data-dependent parts are ``torch.fx.wrap``-ed functions, so the whole model traces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.node import Argument
from torch.fx.proxy import TraceError

__all__ = ["DEFAULT_LEAF_MODULES", "Tracer", "UntraceableModuleError", "symbolic_trace"]

DEFAULT_LEAF_MODULES = ("IntNBitTableBatchedEmbeddingBagsCodegen",)


class UntraceableModuleError(TraceError):
    """fx could not trace a module's ``forward`` (control flow on traced values, iterating one, ...).

    A ``TraceError`` (a ``ValueError``) whose message names the module's path in the traced model
    (``module_path``; ``""`` for the root) and class, and the ways around it.
    """

    def __init__(self, message: str, module_path: str = "") -> None:
        super().__init__(message)
        self.module_path = module_path


def _untraceable(error: TraceError, module: torch.nn.Module, path: str) -> UntraceableModuleError:
    cls = type(module).__name__
    where = f"module {path!r} ({cls})" if path else f"the root module ({cls})"
    return UntraceableModuleError(
        f"cannot trace {where}: {error}. Keep it a leaf (one call_module node, run as is) with "
        f"leaf_modules=[{cls!r}], pass concrete_args for the argument its control flow depends on, or move "
        "the data-dependent code into a torch.fx.wrap-ed function",
        path,
    )


class Tracer(torch.fx.Tracer):
    """An fx tracer whose leaf modules include fbgemm's table-batched embedding modules.

    Args:
        leaf_modules: extra module class names to keep as leaves (``DEFAULT_LEAF_MODULES`` always are).
    """

    def __init__(self, leaf_modules: list[str] | None = None) -> None:
        super().__init__()
        self._leaf_modules = set(DEFAULT_LEAF_MODULES) | set(leaf_modules or [])

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if type(m).__name__ in self._leaf_modules:
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def trace(
        self, root: torch.nn.Module | Callable[..., object], concrete_args: dict[str, object] | None = None
    ) -> torch.fx.Graph:
        """``torch.fx.Tracer.trace``; a ``TraceError`` comes back as :class:`UntraceableModuleError`,
        naming the (innermost) module that could not be traced."""
        try:
            return super().trace(root, concrete_args)
        except UntraceableModuleError:
            raise
        except TraceError as e:
            if isinstance(root, torch.nn.Module):
                raise _untraceable(e, root, "") from e
            raise

    def call_module(
        self,
        m: torch.nn.Module,
        forward: Callable[..., object],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> object:
        try:
            return super().call_module(m, forward, args, kwargs)
        except UntraceableModuleError:
            raise  # an inner module's, already named
        except TraceError as e:
            try:
                path = self.path_of_module(m)
            except NameError:  # a module not registered under the root
                path = f"<unregistered {type(m).__name__}>"
            raise _untraceable(e, m, path) from e

    def create_arg(self, a: Any) -> Argument:
        """Record a ``LazyAwaitable`` (a sharded module's lazy result) as the value it waits for.

        Under tracing the awaitable wraps proxies, so waiting only unwraps them; as torchrec's
        tracer does, a traced graph thereby returns (or passes on) plain values. Matched by class
        name: ``lightrec.fx`` sits below ``lightrec.distributed``, where ``LazyAwaitable`` lives.
        """
        if any(c.__name__ == "LazyAwaitable" for c in type(a).__mro__):
            a = a.wait()
        return super().create_arg(a)


def symbolic_trace(
    root: torch.nn.Module | Callable[..., object],
    concrete_args: dict[str, object] | None = None,
    leaf_modules: list[str] | None = None,
) -> torch.fx.GraphModule:
    """Trace ``root`` with :class:`Tracer` and return the ``GraphModule`` (scriptable).

    torchrec's signature: ``concrete_args`` specializes arguments (``torch.fx``'s meaning) and
    ``leaf_modules`` names more module classes to keep as leaves. For compatibility with
    lightrec's earlier ``symbolic_trace(module, leaf_modules)``, a list as the second positional
    argument is taken as ``leaf_modules``.

    Raises:
        TypeError: ``concrete_args`` is neither a dict nor (the old form) a list of class names.
        UntraceableModuleError: a module's forward cannot be traced; the message names it.
    """
    if isinstance(concrete_args, (list, tuple)) and leaf_modules is None:
        leaf_modules, concrete_args = list(concrete_args), None
    if concrete_args is not None and not isinstance(concrete_args, dict):
        raise TypeError(
            f"symbolic_trace(concrete_args=...) must be a dict of argument name -> value, got "
            f"{type(concrete_args).__name__}: {concrete_args!r}; leaf module class names go in leaf_modules=[...]"
        )
    tracer = Tracer(leaf_modules)
    graph = tracer.trace(root, concrete_args)
    name = root.__class__.__name__ if isinstance(root, torch.nn.Module) else getattr(root, "__name__", "GraphModule")
    return torch.fx.GraphModule(tracer.root, graph, name)
