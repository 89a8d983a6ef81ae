"""``torch.fx`` tracing of lightrec models (``torchrec.fx`` -> ``lightrec.fx``): :class:`Tracer`."""

from lightrec.fx.tracer import DEFAULT_LEAF_MODULES, Tracer, UntraceableModuleError, symbolic_trace

__all__ = ["DEFAULT_LEAF_MODULES", "Tracer", "UntraceableModuleError", "symbolic_trace"]
