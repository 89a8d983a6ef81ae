"""torchrec's ``torchrec.distributed.train_pipeline.tracing``: finding, by tracing the model, how
each sharded module's arguments are read from the batch.

:class:`Tracer` is an fx tracer for sharded models: every sharded module (``ShardedModule``, so
every lightrec sharded collection) is a leaf, a ``call_module`` node, and so is any module named
in ``leaf_modules`` (fully qualified names). :func:`_get_leaf_module_names` names the modules a
pipeline need not trace into: the plain siblings of the modules that hold sharded ones, unless
they set ``_is_pytorch_fx_traceable = True``. Buffers are read as values, not proxied
(``proxy_buffer_attributes = False``), as torchrec does, so models that update buffers trace.

For each sharded module's ``call_module`` node, :func:`call_args_from_batch` walks every argument
back to the model's input through attribute reads (``batch.sparse_features``), item reads
(``batch["kjt"]``, ``d.get("kjt")``) and nothing else, and records the walk as an
:class:`ArgInfo` (a list of :class:`ArgInfoStep`); ``CallArgs.build_args_kwargs(batch)`` replays
the walks on a real batch. An argument the model computes (a module call, a new KJT) has no
such walk, and the module is not pipelined.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from lightrec.distributed.sharding.sharded_module import ShardedModule
from lightrec.fx.tracer import Tracer as _InferenceTracer

__all__ = ["ArgInfo", "ArgInfoStep", "ArgInfoStepFactory", "CallArgs", "Tracer", "call_args_from_batch"]


class Tracer(_InferenceTracer):
    """An fx tracer whose leaves are the sharded modules and the modules named in ``leaf_modules``.

    Args:
        leaf_modules: fully qualified names of more modules to keep as leaves.
    """

    proxy_buffer_attributes = False

    def __init__(self, leaf_modules: list[str] | None = None) -> None:
        super().__init__()
        self._leaf_module_names: list[str] = list(leaf_modules) if leaf_modules is not None else []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if (
            isinstance(m, (ShardedModule, FullyShardedDataParallel))
            or module_qualified_name in self._leaf_module_names
        ):
            return True
        return super().is_leaf_module(m, module_qualified_name)


@dataclass
class ArgInfoStep:
    """One read on the way from the batch to an argument.

    Attributes:
        input_attr: the attribute name or item key read ("" with ``constant`` or a no-op).
        is_getitem: ``value[input_attr]`` rather than ``getattr(value, input_attr)``.
        postproc_module: a module applied to the value (torchrec's post-processing; lightrec's
            tracing records none, but a hand-built step may use one).
        constant: the argument itself, independent of the batch (None: not a constant).
    """

    input_attr: str
    is_getitem: bool
    postproc_module: nn.Module | None
    constant: object | None

    def process(self, arg: Any) -> Any:
        """This step applied to ``arg``."""
        if self.constant is not None:
            return self.constant
        if self.postproc_module is not None:
            return self.postproc_module(arg)
        if self.is_getitem:
            return arg[self.input_attr]
        return getattr(arg, self.input_attr) if self.input_attr else arg


class ArgInfoStepFactory:
    """Builds :class:`ArgInfoStep` s by kind (torchrec's constructors)."""

    @classmethod
    def noop(cls) -> ArgInfoStep:
        return ArgInfoStep("", False, None, None)

    @classmethod
    def get_attr(cls, name: str) -> ArgInfoStep:
        return ArgInfoStep(name, False, None, None)

    @classmethod
    def get_item(cls, index: str) -> ArgInfoStep:
        return ArgInfoStep(index, True, None, None)

    @classmethod
    def postproc(cls, module: nn.Module) -> ArgInfoStep:
        return ArgInfoStep("", False, module, None)

    @classmethod
    def from_scalar(cls, value: object) -> ArgInfoStep:
        return ArgInfoStep("", False, None, value)


@dataclass
class ArgInfo:
    """How one argument is read from the batch: ``steps`` applied in order."""

    steps: list[ArgInfoStep]

    def add_step(self, step: ArgInfoStep) -> ArgInfo:
        """Put ``step`` first (the walk from the module back to the batch finds steps in reverse)."""
        self.steps.insert(0, step)
        return self

    def append_step(self, step: ArgInfoStep) -> ArgInfo:
        self.steps.append(step)
        return self

    def process_steps(self, arg: Any) -> Any:
        """The argument for the batch ``arg`` (None when there are no steps)."""
        if not self.steps:
            return None
        for step in self.steps:
            arg = step.process(arg)
        return arg


@dataclass
class CallArgs:
    """How a module call's positional and keyword arguments are read from the batch."""

    args: list[ArgInfo]
    kwargs: dict[str, ArgInfo]

    def build_args_kwargs(self, initial_input: Any) -> tuple[list[Any], dict[str, Any]]:
        """``(args, kwargs)`` for the batch ``initial_input``."""
        args = [arg.process_steps(initial_input) for arg in self.args]
        kwargs = {key: arg.process_steps(initial_input) for key, arg in self.kwargs.items()}
        return args, kwargs


def _arg_info(arg: object) -> ArgInfo | None:
    """The walk from ``arg`` (a node's argument) back to the model's input, or None."""
    info = ArgInfo([])
    while isinstance(arg, torch.fx.Node):
        node = arg
        if node.op == "placeholder":
            return info.add_step(ArgInfoStepFactory.noop()) if not info.steps else info
        if node.op == "call_function" and node.target is getattr:
            info.add_step(ArgInfoStepFactory.get_attr(str(node.args[1])))
        elif node.op == "call_function" and node.target is operator.getitem:
            info.add_step(ArgInfoStepFactory.get_item(node.args[1]))  # type: ignore[arg-type]
        elif node.op == "call_method" and node.target == "get" and len(node.args) == 2:
            info.add_step(ArgInfoStepFactory.get_item(node.args[1]))  # type: ignore[arg-type]
        else:
            return None  # computed by the model: a module or function call, a new KJT
        arg = node.args[0]
    return None  # a constant: torchrec pipelines those only with pipeline_postproc


def call_args_from_batch(node: torch.fx.Node) -> CallArgs | None:
    """:class:`CallArgs` of a ``call_module`` node whose arguments all come from the model's input
    by reads (``None`` arguments are skipped, as torchrec does); None if one does not."""
    args: list[ArgInfo] = []
    for arg in node.args:
        if arg is None:
            continue
        info = _arg_info(arg)
        if info is None:
            return None
        args.append(info)
    kwargs: dict[str, ArgInfo] = {}
    for key, arg in node.kwargs.items():
        info = _arg_info(arg)
        if info is None:
            return None
        kwargs[key] = info
    return CallArgs(args, kwargs)


def _holds_sharded(module: nn.Module, path: str, leaves: set[str]) -> bool:
    """Whether ``module`` holds a sharded module; adds its plain children's names to ``leaves``."""
    holders = set()
    for name, child in module.named_children():
        if isinstance(child, ShardedModule) or _holds_sharded(child, f"{path}{name}.", leaves):
            holders.add(name)
    if holders:
        for name, child in module.named_children():
            if name not in holders and not getattr(child, "_is_pytorch_fx_traceable", False):
                leaves.add(path + name)
    return bool(holders)


def _get_leaf_module_names(model: nn.Module) -> list[str]:
    """Fully qualified names of the modules tracing can stop at: the children, beside a child
    holding a sharded module, that hold none (the shallowest trace that reaches every sharded
    module), unless they are marked ``_is_pytorch_fx_traceable``."""
    leaves: set[str] = set()
    _holds_sharded(model, "", leaves)
    return sorted(leaves)
