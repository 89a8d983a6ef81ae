"""torchrec's ``torchrec.distributed.shard._shard_modules`` call shape, for inference sharding.

Inference sharding lives in ``lightrec.inference``; this alias imports it on call so the
distributed package does not depend on the inference package at import time.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["_shard_modules", "shard_modules"]


def shard_modules(module: nn.Module, device: Any = None, env: Any = None) -> nn.Module:
    """Shard the quantized collections of ``module`` for serving (see ``lightrec.inference.shard_modules``)."""
    from lightrec.inference import shard_modules as _impl

    return _impl(module, device=device, env=env)


_shard_modules = shard_modules
