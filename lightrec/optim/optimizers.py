"""torchrec's ``torchrec.optim.optimizers`` path: ``in_backward_optimizer_filter``, re-exported from
:mod:`lightrec.optim.in_backward` (torchrec's own optimizer classes there -- LAMB, LarsSGD,
PartialRowWiseAdam -- are not implemented by lightrec)."""

from lightrec.optim.in_backward import in_backward_optimizer_filter

__all__ = ["in_backward_optimizer_filter"]
