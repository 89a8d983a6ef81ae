"""torchrec's ``torchrec.optim.apply_optimizer_in_backward`` path, re-exported from
:mod:`lightrec.optim.in_backward`."""

from lightrec.optim.in_backward import apply_optimizer_in_backward

__all__ = ["apply_optimizer_in_backward"]
