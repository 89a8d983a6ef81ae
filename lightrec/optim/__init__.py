"""Optimizers: name-keyed optimizers, fused embedding optimizer specs, in-backward markers, the
row-wise optimizers torchrec fuses (LAMB, LarsSGD, PartialRowWiseAdam/LAMB), and torchrec's
``clipping`` / ``warmup`` wrappers (``lightrec.optim.clipping``, ``lightrec.optim.warmup``)."""

from lightrec.optim.fused_spec import (
    EmbOptimType,
    FusedOptimizerSpec,
    WeightDecayMode,
    optimizer_class_to_spec,
)
from lightrec.optim.in_backward import (
    apply_optimizer_in_backward,
    fused_spec_from_parameter,
    in_backward_optimizer_filter,
)
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.optim.rowwise_optimizers import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB

__all__ = [
    "LAMB",
    "CombinedOptimizer",
    "EmbOptimType",
    "FusedOptimizerSpec",
    "KeyedOptimizer",
    "KeyedOptimizerWrapper",
    "LarsSGD",
    "OptimizerWrapper",
    "PartialRowWiseAdam",
    "PartialRowWiseLAMB",
    "RowWiseAdagrad",
    "WeightDecayMode",
    "apply_optimizer_in_backward",
    "fused_spec_from_parameter",
    "in_backward_optimizer_filter",
    "optimizer_class_to_spec",
]
