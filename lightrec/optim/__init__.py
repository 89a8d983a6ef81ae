"""Optimizers: name-keyed optimizers, fused embedding optimizer specs, in-backward markers, the
row-wise optimizers torchrec fuses (LAMB, LarsSGD, PartialRowWiseAdam/LAMB), and torchrec's
``clipping`` / ``warmup`` wrappers (``lightrec.optim.clipping``, ``lightrec.optim.warmup``).

As torchrec's ``torchrec.optim`` does, the package also names ``SGD``, ``Adam`` and ``Adagrad``: they
are torch's optimizers (``apply_optimizer_in_backward`` fuses them into the same rule), and its
submodules are attributes (``lightrec.optim.optimizers`` loads on first use).
"""

import importlib
from types import ModuleType

from torch.optim import SGD, Adagrad, Adam

from lightrec.optim.clipping import GradientClipping, GradientClippingOptimizer
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
from lightrec.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage

# torchrec's torchrec.optim imports its submodules; the torchrec-path re-export `optimizers` loads
# on first attribute access (no lightrec file imports them).
_LAZY_SUBMODULES = frozenset({"optimizers"})

# torchrec's path ``lightrec.optim.apply_optimizer_in_backward`` is a submodule named like the function
# this package exports, and loading a submodule sets the package attribute of its name: a user's
# ``import lightrec.optim.apply_optimizer_in_backward`` replaced the function with the module ("'module'
# object is not callable" in RecModule). Loaded once here, the submodule never rebinds it again.
_function = apply_optimizer_in_backward
importlib.import_module(f"{__name__}.apply_optimizer_in_backward")
apply_optimizer_in_backward = _function


def __getattr__(name: str) -> ModuleType:  # PEP 562
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LAMB",
    "SGD",
    "Adagrad",
    "Adam",
    "GradientClipping",
    "GradientClippingOptimizer",
    "WarmupOptimizer",
    "WarmupPolicy",
    "WarmupStage",
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
