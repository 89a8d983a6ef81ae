"""Optimizers: name-keyed optimizers, fused embedding optimizer specs, in-backward markers."""

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

__all__ = [
    "CombinedOptimizer",
    "EmbOptimType",
    "FusedOptimizerSpec",
    "KeyedOptimizer",
    "KeyedOptimizerWrapper",
    "OptimizerWrapper",
    "RowWiseAdagrad",
    "WeightDecayMode",
    "apply_optimizer_in_backward",
    "fused_spec_from_parameter",
    "in_backward_optimizer_filter",
    "optimizer_class_to_spec",
]
