"""torchrec's ``torchrec.optim.optimizers`` path: ``in_backward_optimizer_filter`` and the optimizer
classes torchrec names there for fused embedding tables.

``LAMB``, ``PartialRowWiseLAMB``, ``PartialRowWiseAdam`` and ``LarsSGD`` are lightrec's working
optimizers (:mod:`lightrec.optim.rowwise_optimizers`), fused by ``apply_optimizer_in_backward``
into the same rule; torchrec's ``SGD``, ``Adam`` and ``Adagrad`` placeholders are torch's
optimizers here (they map to the fused SGD / ADAM / ADAGRAD).
"""

from torch.optim import SGD, Adagrad, Adam

from lightrec.optim.in_backward import in_backward_optimizer_filter
from lightrec.optim.rowwise_optimizers import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB

__all__ = [
    "LAMB",
    "SGD",
    "Adagrad",
    "Adam",
    "LarsSGD",
    "PartialRowWiseAdam",
    "PartialRowWiseLAMB",
    "in_backward_optimizer_filter",
]
