"""Walk a model for the ``torch.export`` round trip (``torchrec.ir.utils``).

::

    model, fqns = encapsulate_ir_modules(model)              # metadata buffers on the collections
    shapes = mark_dynamic_kjt(kjt)                           # optional: any number of ids per batch
    ep = torch.export.export(model, (kjt,), dynamic_shapes=shapes.dynamic_shapes(model, (kjt,)),
                             strict=False, preserve_module_call_signature=tuple(fqns))
    torch.export.save(ep, "model.pt2")
    ...
    ep = torch.export.load("model.pt2")                      # import lightrec first (KJT pytree)
    model = decapsulate_ir_modules(torch.export.unflatten(ep))   # eager collections, with weights

``preserve_module_call_signature`` keeps each serialized module a call with its own
``KeyedJaggedTensor`` in and ``KeyedTensor`` / ``{feature: JaggedTensor}`` out in the unflattened
program, which is what lets :func:`decapsulate_ir_modules` put eager modules in their place.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch import nn
from torch.export import Dim, ExportedProgram, ShapesCollection
from torch.export.graph_signature import ConstantArgument
from torch.export.unflatten import InterpreterModule, InterpreterModuleDispatcher, UnflattenedModule

from lightrec.ir.serializer import IR_METADATA, JsonSerializer
from lightrec.ir.types import IRSerializationError, qualname
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "DYNAMIC_DIMS",
    "decapsulate_ir_modules",
    "encapsulate_ir_modules",
    "get_device",
    "mark_dynamic_kjt",
    "qualname",
    "unlift_and_swap_modules",
]

#: How many dynamic dims of each base name :func:`mark_dynamic_kjt` made (names must be unique in one export).
DYNAMIC_DIMS: defaultdict[str, int] = defaultdict(int)


def get_device(tensors: list[torch.Tensor | None]) -> torch.device | None:
    """The device of the first tensor that is not ``None`` (``None`` if all are)."""
    return next((t.device for t in tensors if t is not None), None)


def encapsulate_ir_modules(
    module: nn.Module,
    serializer: type[JsonSerializer] = JsonSerializer,
    fqn: str = "",
) -> tuple[nn.Module, list[str]]:
    """Write every serializable submodule's metadata into its ``ir_metadata`` buffer, in place.

    Args:
        module: the model (or one collection).
        serializer: the serializer registry to use.
        fqn: ``module``'s own name in the model (for the recursion; leave empty).

    Returns:
        ``(module, fqns)``: the same module, and the names of the serialized submodules, to pass to
        ``torch.export.export(..., preserve_module_call_signature=tuple(fqns))`` (a serialized
        ``module`` itself, e.g. an exported ``EmbeddingBagCollection``, is not listed: the
        program's signature is its own).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    registry = serializer.module_to_serializer_cls
    typename = qualname(module)
    if typename in registry or type(module).__name__ in registry:
        children = serializer.encapsulate_module(module)
        # the exported module itself (fqn ""): its call signature is the program's own, and
        # torch.export refuses "" in preserve_module_call_signature
        fqns = [fqn] if fqn else []
    else:
        children = [name for name, _ in module.named_children()]
        fqns = []
    for child in children:
        _, found = encapsulate_ir_modules(module.get_submodule(child), serializer, f"{fqn}.{child}" if fqn else child)
        fqns.extend(found)
    return module, fqns


def decapsulate_ir_modules(
    module: nn.Module | ExportedProgram,
    serializer: type[JsonSerializer] = JsonSerializer,
    device: torch.device | str | None = None,
    finalize_interpreter_modules: bool = False,
    short_circuit_pytree_ebc_regroup: bool = False,
) -> nn.Module:
    """Replace every submodule carrying ``ir_metadata`` with the eager module it describes.

    Children are rebuilt before their parents, so a module built from its children (a
    feature-processed collection) gets eager children. Each rebuilt module holds the program's
    tensors for it (its tables' weights).

    Args:
        module: ``torch.export.unflatten(ep)`` (an ``ExportedProgram`` is unflattened here).
        serializer: the registry the program was encapsulated with.
        device: where to build the rebuilt modules (default: the device each one was exported from);
            a ``torch.device`` or its string (``"cpu"``).
        finalize_interpreter_modules: call ``finalize()`` on the program's remaining graph modules
            (regenerates their code from their graphs; torch runs the graphs in its interpreter
            either way unless its ``RUN_WITH_INTERPRETER`` switch is off).
        short_circuit_pytree_ebc_regroup: torchrec's option to drop the pytree flatten/unflatten
            between a collection and a ``KTRegroupAsDict``; lightrec has no ``KTRegroupAsDict``, so
            there is nothing to drop (torchrec, too, leaves a model without one unchanged). Needs
            ``finalize_interpreter_modules=True``, as in torchrec.

    Returns:
        The module with its serialized submodules replaced (the module itself if it was one).

    Raises:
        IRSerializationError: ``module`` is ``ep.module()``, whose one graph inlines every submodule
            (replacing them would change nothing); pass ``torch.export.unflatten(ep)``. The errors of
            rebuilding one module (its metadata, its tensors) name its path in the model.
        ValueError: ``short_circuit_pytree_ebc_regroup`` without ``finalize_interpreter_modules``,
            or a ``device`` string torch cannot parse.
    """
    if short_circuit_pytree_ebc_regroup and not finalize_interpreter_modules:
        raise ValueError(
            "decapsulate_ir_modules(short_circuit_pytree_ebc_regroup=True) needs finalize_interpreter_modules=True "
            "(torchrec's rule)"
        )
    if isinstance(module, ExportedProgram):
        module = torch.export.unflatten(module)
    if (
        isinstance(module, torch.fx.GraphModule)
        and not isinstance(module, (UnflattenedModule, InterpreterModule))
        and any(name.rsplit(".", 1)[-1] == IR_METADATA for name, _ in module.named_buffers())
    ):
        raise IRSerializationError(
            "decapsulate_ir_modules got ep.module(), whose one graph inlines every submodule; pass "
            "torch.export.unflatten(ep) (export with preserve_module_call_signature=tuple(fqns))"
        )
    signature_args: dict[int, int] = {}
    if isinstance(module, UnflattenedModule):
        preserved = {entry.fqn for entry in module.module_call_graph if entry.signature is not None}
        _check_signatures_preserved(module, preserved)
    module = _decapsulate(module, serializer, _as_device(device), signature_args)
    _drop_threaded_inputs(module, signature_args)
    if finalize_interpreter_modules:
        for sub in module.modules():
            if isinstance(sub, InterpreterModule):
                sub.finalize()
    return module


def _check_signatures_preserved(root: UnflattenedModule, preserved: set[str]) -> None:
    """Every serialized module of the program kept its call signature (else its graph takes loose tensors)."""
    lost = [
        fqn for fqn, sub in root.named_modules(remove_duplicate=False)
        if fqn and fqn not in preserved and IR_METADATA in dict(sub.named_buffers(recurse=False))
    ]  # fmt: skip
    if lost:
        raise IRSerializationError(
            f"{lost} were exported without their call signatures, so their graphs take loose tensors, not a "
            "KeyedJaggedTensor; export with preserve_module_call_signature=tuple(fqns) (the names "
            "encapsulate_ir_modules returned)"
        )


def _as_device(device: torch.device | str | None) -> torch.device | None:
    if not isinstance(device, str):
        return device
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is not a device torch knows; pass e.g. 'cpu' or 'cuda:0'") from e


def _decapsulate(
    module: nn.Module,
    serializer: type[JsonSerializer],
    device: torch.device | None,
    signature_args: dict[int, int],
    fqn: str = "",
) -> nn.Module:
    """Rebuild ``module``'s serialized descendants, children first; records each rebuilt module's
    positional arity (``id(rebuilt) -> n``) for :func:`_drop_threaded_inputs`. ``fqn`` is
    ``module``'s path in the model, for the errors."""
    for name, child in list(module.named_children()):
        rebuilt = _decapsulate(child, serializer, device, signature_args, f"{fqn}.{name}" if fqn else name)
        if rebuilt is not child:
            setattr(module, name, rebuilt)
    # a module called several times unflattens to a dispatcher over one traced graph per call
    traced = module.call_modules()[0] if isinstance(module, InterpreterModuleDispatcher) else module
    if IR_METADATA not in dict(traced.named_buffers(recurse=False)):
        return module
    try:
        rebuilt = serializer.decapsulate_module(traced, device)
    except IRSerializationError as e:
        # the serializer sees one graph module (an InterpreterModule): say which one of the model it is
        where = f"module {fqn!r}" if fqn else "the exported module itself"
        raise type(e)(f"cannot rebuild {where} of the program from its {IR_METADATA!r}: {e}") from e
    if isinstance(traced, InterpreterModule):
        signature_args[id(rebuilt)] = sum(
            1 for n in traced.graph.nodes if n.op == "placeholder" and _POSITIONAL.fullmatch(n.name)
        )
    return rebuilt


# the placeholders torch.export.unflatten makes for a preserved call signature's positional arguments
_POSITIONAL = re.compile(r"_positional_arg_\d+")


def _drop_threaded_inputs(root: nn.Module, signature_args: dict[int, int]) -> None:
    """Call every rebuilt module with its own arguments only.

    ``torch.export.unflatten`` may thread values of the caller into a preserved submodule's graph
    as extra leading arguments (e.g. a symbolic batch size the caller already computed); the eager
    module that replaced that graph takes only its signature's arguments.
    """
    for graph_module in root.modules():
        if not isinstance(graph_module, (InterpreterModule, UnflattenedModule)):
            continue
        changed = False
        for node in graph_module.graph.nodes:
            if node.op != "call_module":
                continue
            arity = signature_args.get(id(graph_module.get_submodule(node.target)))
            if arity is not None and len(node.args) > arity:
                node.args = node.args[len(node.args) - arity :]
                changed = True
        if changed:
            graph_module.graph.eliminate_dead_code()
            graph_module.finalize()  # regenerate its code (used when not run by the interpreter)


def unlift_and_swap_modules(
    ep: ExportedProgram,
    serializer: type[JsonSerializer] = JsonSerializer,
    device: torch.device | str | None = None,
) -> torch.fx.GraphModule:
    """``ep.module()`` with the serialized modules swapped for the eager modules they describe.

    Unlike :func:`decapsulate_ir_modules` (which works on ``torch.export.unflatten(ep)``), this keeps
    the program's one flat graph and calls the eager modules from it (``torch.export``'s module swap).
    The serialized modules must have been exported with ``preserve_module_call_signature``.

    Args:
        ep: the (loaded) exported program.
        serializer: the registry it was encapsulated with.
        device: where to build the eager modules (default: where each was exported from).

    Raises:
        IRSerializationError: a serialized module was exported without its call signature, is built
            from serialized children (a feature-processed collection), or returns ``None`` leaves (an
            ``EmbeddingCollection``'s JaggedTensors): torch's swap would misplace its outputs, so use
            :func:`decapsulate_ir_modules` on ``torch.export.unflatten(ep)`` for those.
    """
    from torch.export._swap import _swap_modules  # private: torch's only module-swap entry point

    unlifted = ep.module()
    suffix = "." + IR_METADATA
    fqns = sorted(key[: -len(suffix)] for key in ep.constants if key.endswith(suffix))
    signatures = {entry.fqn: entry.signature for entry in ep.module_call_graph}
    for fqn in fqns:
        nested = [other for other in fqns if other.startswith(fqn + ".")]
        if nested:
            # torch's swap misnumbers the outputs of a module whose preserved children are swapped with it
            raise IRSerializationError(
                f"unlift_and_swap_modules cannot swap {fqn}: it is built from serialized children {nested}; "
                "use decapsulate_ir_modules(torch.export.unflatten(ep))"
            )
        signature = signatures.get(fqn)
        if signature is None:
            raise IRSerializationError(
                f"{fqn} was exported without its call signature: pass preserve_module_call_signature=tuple(fqns) "
                "(the names encapsulate_ir_modules returned) to torch.export.export"
            )
        if any(isinstance(out, ConstantArgument) for out in signature.outputs):
            # torch's swap numbers the outputs without their None leaves and would hand out shifted tensors
            raise IRSerializationError(
                f"unlift_and_swap_modules cannot swap {fqn}: its outputs hold None leaves (a JaggedTensor "
                "without weights or offsets); use decapsulate_ir_modules(torch.export.unflatten(ep))"
            )
    constants = {fqn: _graph_constants(unlifted, fqn) for fqn in fqns}
    on = _as_device(device)
    swaps = {fqn: _decapsulate(unlifted.get_submodule(fqn), serializer, on, {}, fqn) for fqn in fqns}
    for fqn, eager in swaps.items():
        for target, value in constants[fqn].items():
            path, _, name = target.rpartition(".")
            owner = eager.get_submodule(path)
            if name not in dir(owner):
                setattr(owner, name, value)
    return _swap_modules(ep, swaps)


def _graph_constants(unlifted: torch.fx.GraphModule, fqn: str) -> dict[str, object]:
    """``{path under fqn: value}`` of every attribute the program's graph reads from the module at ``fqn``.

    The swap checks the graph before it drops the swapped module's traced code, so every
    ``get_attr`` of that code (constants torch.export lifted, e.g. ``lifted_tensor_0``) must still
    resolve on the eager module; they are small and unused by it.
    """
    prefix = fqn + "."
    module = unlifted.get_submodule(fqn)
    found: dict[str, object] = {}
    for node in unlifted.graph.nodes:
        if node.op == "get_attr" and node.target.startswith(prefix):
            path, _, name = node.target[len(prefix) :].rpartition(".")
            found[node.target[len(prefix) :]] = getattr(module.get_submodule(path), name)
    return found


def _dim(name: str, min: int | None = None) -> Dim:  # noqa: A002 - Dim's own keyword
    """A dynamic dim named ``<name>_<n>``, unique within the process."""
    unique = f"{name}_{DYNAMIC_DIMS[name]}"
    DYNAMIC_DIMS[name] += 1
    return Dim(unique, min=min) if min is not None else Dim(unique)


def mark_dynamic_kjt(
    kjt: KeyedJaggedTensor,
    shapes_collection: ShapesCollection | None = None,
    variable_length: bool = False,
    variable_batch: bool = False,
    vlen: Dim | None = None,
    llen: Dim | None = None,
    batch_size: Dim | None = None,
) -> ShapesCollection:
    """Mark the sizes of ``kjt``'s tensors dynamic for ``torch.export``.

    The KJT enters an exported program as ``values [N]``, ``weights [N]`` (if any) and
    ``lengths [F * B]``. ``N`` (ids in the batch) is always dynamic; with ``variable_batch`` the
    batch size ``B`` is too (``lengths`` stays a multiple of the ``F`` keys); with
    ``variable_length`` the lengths' size is free (a variable-batch KJT's per-key batches).

    Args:
        kjt: the example batch (at least 2 ids; ``B >= 2`` with ``variable_batch``: torch.export
            specializes sizes 0 and 1).
        shapes_collection: add to this collection (several inputs) instead of a new one.
        variable_length: the lengths' size is its own dynamic dim (``llen``), for models that read
            the KJT without a batch size; lightrec's collections need ``len(lengths) == F * B``
            (use ``variable_batch``), and a variable-batch KJT (per-key batch sizes) exports with
            static shapes only, since those sizes are part of its pytree context.
        variable_batch: the batch size is dynamic, the same for every key.
        vlen / llen: dims to use for ``N`` / the lengths' size (to share a dim with other inputs).
        batch_size: the dim to use for ``B`` with ``variable_batch`` (share it with the dense
            features' first dim: ``shapes[dense] = (batch_size, None)``).

    Returns:
        The collection; pass ``shapes.dynamic_shapes(model, args)`` as ``torch.export``'s ``dynamic_shapes``.

    Raises:
        ValueError: the example has fewer than 2 ids (or samples, with ``variable_batch``), or
            ``variable_length`` is asked of a variable-batch KJT.
    """
    if variable_length and kjt.variable_stride_per_key():
        raise ValueError(
            "mark_dynamic_kjt(variable_length=True) got a variable-batch KeyedJaggedTensor: its per-key batch sizes "
            f"{kjt.stride_per_key()} are part of its pytree context, so torch.export fixes the lengths' size; "
            "export it without dynamic shapes, or use a fixed-batch KJT with variable_batch=True"
        )
    shapes = ShapesCollection() if shapes_collection is None else shapes_collection
    values, weights, lengths = kjt.values(), kjt.weights_or_none(), kjt.lengths()
    if values.numel() < 2:
        raise ValueError(
            f"mark_dynamic_kjt needs an example KJT with at least 2 ids, got {values.numel()}: torch.export "
            "specializes sizes 0 and 1, so the program would accept no other size; pass a larger example batch"
        )
    vlen = _dim("vlen", min=2) if vlen is None else vlen
    shapes[values] = (vlen,)
    if weights is not None:
        shapes[weights] = (vlen,)
    if variable_length:
        shapes[lengths] = (_dim("llen") if llen is None else llen,)
    elif variable_batch and len(kjt.keys()) > 0:
        if kjt.stride() < 2:
            raise ValueError(
                f"mark_dynamic_kjt(variable_batch=True) needs an example batch of at least 2 samples, got "
                f"{kjt.stride()}: torch.export specializes sizes 0 and 1"
            )
        batch = _dim("batch_size", min=2) if batch_size is None else batch_size
        shapes[lengths] = (batch * len(kjt.keys()),)
    return shapes
