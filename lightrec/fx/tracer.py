"""``torch.fx`` tracing for inference models (the TorchRec tutorial's ``torchrec.fx.Tracer``).

Batched-kernel modules are kept as leaves (one ``call_module`` node each) so that their
Python-side bookkeeping is not traced and ``torch.jit.script`` compiles them from their own
source. lightrec's sparse types trace as values (their constructors become graph nodes), and the
kernels' data-dependent parts are ``torch.fx.wrap``-ed functions, so the whole model traces.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.node import Argument

__all__ = ["DEFAULT_LEAF_MODULES", "Tracer", "symbolic_trace"]

DEFAULT_LEAF_MODULES = ("IntNBitTableBatchedEmbeddingBagsCodegen",)


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

    def create_arg(self, a: Any) -> Argument:
        """Record a ``LazyAwaitable`` (a sharded module's lazy result) as the value it waits for.

        Under tracing the awaitable wraps proxies, so waiting only unwraps them; as torchrec's
        tracer does, a traced graph thereby returns (or passes on) plain values. Matched by class
        name: ``lightrec.fx`` sits below ``lightrec.distributed``, where ``LazyAwaitable`` lives.
        """
        if any(c.__name__ == "LazyAwaitable" for c in type(a).__mro__):
            a = a.wait()
        return super().create_arg(a)


def symbolic_trace(module: torch.nn.Module, leaf_modules: list[str] | None = None) -> torch.fx.GraphModule:
    """Trace ``module`` with :class:`Tracer` and return the ``GraphModule`` (scriptable)."""
    tracer = Tracer(leaf_modules)
    graph = tracer.trace(module)
    name = module.__class__.__name__
    return torch.fx.GraphModule(tracer.root, graph, name)
