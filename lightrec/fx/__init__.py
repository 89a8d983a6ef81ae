"""torchrec-compatible ``lightrec.fx.Tracer`` (``from torchrec.fx import Tracer`` in the seed)."""

from lightrec.inference.fx import Tracer, symbolic_trace

__all__ = ["Tracer", "symbolic_trace"]
