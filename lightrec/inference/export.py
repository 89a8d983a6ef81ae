"""Serving artifacts: TorchScript (fx trace + script) and ``torch.export`` programs, plus metadata.

Artifacts take plain tensors, not a ``KeyedJaggedTensor``, so that a process without lightrec (C++,
or Python with only torch) can call them. The exported module wraps the model as::

    forward(dense_features [B, I] float32,       # omitted for models that take only the KJT
            values [N] int64,                     # ids of every feature, key-major (feature order
            lengths [F * B] int64                 #   = meta["feature_names"]), lengths per (feature, sample)
            [, weights [N] float32])              # only for weighted collections
        -> the model's output (DLRM: logits [B, 1])

and builds the KJT inside. ``<path>.meta.json`` records the input contract, the tables (with, for
quantized pooled tables, their place in the flat table buffer: :func:`table_storage`) and the
versions; :func:`lightrec.inference.load` reads both and returns a :class:`Predictor`.

``format="torchscript"`` traces with :class:`lightrec.inference.Tracer` and scripts the graph;
the file loads with ``torch.jit.load`` (``import fbgemm_gpu`` first when ``meta["uses_fbgemm"]``).
``format="export"`` runs ``torch.export`` with a dynamic batch size; it loads with
``torch.export.load`` after ``import lightrec.inference`` (the pure-torch kernel is a lightrec
custom op) or ``import fbgemm_gpu``; exported programs take batches of 2 or more (``Predictor`` pads a
single request). Dynamic int8 dense layers (``quantize_dense=True``) and
fbgemm TBE groups of sharded models can only be exported as TorchScript.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code.

import errno
import importlib.metadata
import inspect
import itertools
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, List, Optional, TypedDict, Union

import torch
import torch.distributed as dist
from torch import nn

from lightrec._version import __version__
from lightrec.distributed.checkpoint import consolidate_checkpoint, is_sharded_checkpoint, load_file
from lightrec.fx.tracer import symbolic_trace
from lightrec.inference.gather import has_sharded_collections, run_on_rank, sharding_group, unshard
from lightrec.inference.quantize import quantize
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "EXPORT_FORMATS",
    "EXPORT_ID_FILE",
    "ArtifactMeta",
    "ExportError",
    "ModelContract",
    "TableMeta",
    "TableStorage",
    "TensorInputModule",
    "describe_model",
    "export",
    "export_from_checkpoint",
    "export_on_rank",
    "table_storage",
]

EXPORT_FORMATS = ("torchscript", "export")
# The artifact's extra file holding the export id that its ``.meta.json`` also records.
EXPORT_ID_FILE = "lightrec_export_id"


class ExportError(RuntimeError):
    """The model cannot be written in the requested format (the message says what to change)."""


class TableStorage(TypedDict):
    """Where a quantized pooled table lies in its collection's flat buffer (see :func:`table_storage`)."""

    buffer: str
    offset: int
    rows: int
    row_bytes: int


class _TableMetaBase(TypedDict):
    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: list[str]
    pooling: str
    data_type: str


class TableMeta(_TableMetaBase, total=False):
    """One entry of ``meta["tables"]``; ``id_space`` only for managed-collision tables (raw ids),
    ``storage`` only for quantized pooled tables kept in a flat buffer."""

    id_space: int
    storage: TableStorage


class ModelContract(TypedDict):
    """The input contract :func:`describe_model` reads off a model (part of the artifact's metadata)."""

    feature_names: list[str]
    tables: list[TableMeta]
    is_weighted: bool
    dense_in_features: int | None


class ArtifactMeta(ModelContract, total=False):
    """``<path>.meta.json`` as :func:`export` writes it (plus whatever ``extra_meta`` it was given)."""

    format: str
    inputs: list[str]
    takes_dense: bool
    uses_fbgemm: bool
    output: str
    dtype: list[str]
    versions: dict[str, str | None]
    export_id: str  # also stored in the artifact (EXPORT_ID_FILE): the two files are one export


# ``(dense_features [B, I], kjt)`` or a KJT alone (a model that takes no dense features).
ExampleBatch = Union[KeyedJaggedTensor, tuple[torch.Tensor, KeyedJaggedTensor]]


class TensorInputModule(nn.Module):
    """Calls ``model(dense, kjt)`` (or ``model(kjt)``) from tensors; see the module docstring."""

    def __init__(self, model: nn.Module, feature_names: List[str], takes_dense: bool, weighted: bool) -> None:
        super().__init__()
        self.model = model
        self._feature_names = feature_names
        self._takes_dense = takes_dense
        self._weighted = weighted

    def forward(self, dense_features: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        kjt = KeyedJaggedTensor(keys=self._feature_names, values=values, weights=weights, lengths=lengths,
                                stride=lengths.shape[0] // len(self._feature_names))
        if self._takes_dense:
            return self.model(dense_features, kjt)
        return self.model(kjt)


def _tables_of(model: nn.Module) -> list[tuple[nn.Module, list[EmbeddingBagConfig | EmbeddingConfig]]]:
    out = []
    for m in model.modules():
        configs = getattr(m, "embedding_bag_configs", None)
        if not callable(configs):  # sequence collections (EmbeddingCollection and its quantized form)
            configs = getattr(m, "embedding_configs", None)
        if callable(configs):
            out.append((m, list(configs())))
    # a sharded collection holds per-group collections; keep the outermost ones only
    outer = []
    for m, configs in out:
        if not any(m is not o and any(m is sub for sub in o.modules()) for o, _ in out):
            outer.append((m, configs))
    return outer


def describe_model(model: nn.Module, dense_in_features: int | None = None) -> ModelContract:
    """Input contract of ``model``: feature names (KJT key order), tables, dense width, weighting."""
    found = _tables_of(model)
    if not found:
        raise ExportError(f"{type(model).__name__} has no embedding collection; nothing tells the feature names")
    feature_names: list[str] = []
    tables: list[TableMeta] = []
    weighted = False
    for module, configs in found:
        weighted = weighted or bool(getattr(module, "is_weighted", lambda: False)())
        id_spaces = getattr(module, "id_spaces", None)  # managed-collision tables take raw ids
        spaces = id_spaces() if callable(id_spaces) else {}
        for t in configs:
            feature_names.extend(t.feature_names)
            tables.append({"name": t.name, "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim,
                           "feature_names": list(t.feature_names), "pooling": t.pooling.value,
                           "data_type": t.data_type.value})
            if t.name in spaces:  # ids in [0, id_space): raw ids, remapped inside the artifact
                tables[-1]["id_space"] = int(spaces[t.name]) or 2**63 - 1
    if dense_in_features is None:
        for m in model.modules():
            if type(m).__name__ == "DenseArch":
                dense_in_features = int(vars(m)["_in_features"])  # a plain int attribute of DenseArch
                break
    return {"feature_names": feature_names, "tables": tables, "is_weighted": weighted,
            "dense_in_features": dense_in_features}


# A QuantEmbeddingBagCollection keeps every table back to back in this one uint8 buffer; its
# embedding_bags.<t>.weight buffers are views of it (lightrec.quant.embedding_modules).
_FLAT_BUFFER = "_flat_weights"


def table_storage(model: nn.Module, prefix: str = "model.") -> dict[str, TableStorage]:
    """Where each table of a quantized pooled collection lies in ``model``'s flat table buffers.

    A TorchScript artifact keeps only the flat buffer of such a collection (the per-table views are
    not traced), so the metadata records each table's place in it, for whoever writes rows into a
    loaded artifact (``lightrec.serving.deltas``)::

        {table: {"buffer": "model.<collection>._flat_weights",   the buffer's name in the artifact
                 "offset": bytes before the table's first row,
                 "rows": R, "row_bytes": W}}                       the table is flat[offset : offset + R * W]

    Args:
        model: the model being exported.
        prefix: what the artifact puts before the model's names (``TensorInputModule``'s ``model.``).
    """
    buffers = dict(model.named_buffers())
    out: dict[str, TableStorage] = {}
    for name, flat in buffers.items():
        if name.rsplit(".", 1)[-1] != _FLAT_BUFFER or flat.dtype != torch.uint8:
            continue
        owner = name[: -len(_FLAT_BUFFER)]  # "<collection>." or ""
        storage = flat.untyped_storage().data_ptr()
        for key, view in buffers.items():
            table = key[len(owner) + len("embedding_bags."): -len(".weight")]
            if (key.startswith(f"{owner}embedding_bags.") and key.endswith(".weight") and "." not in table
                    and view.dim() == 2 and view.dtype == torch.uint8 and view.stride() == (view.shape[1], 1)
                    and view.untyped_storage().data_ptr() == storage):  # fmt: skip
                out[table] = {"buffer": f"{prefix}{name}", "offset": view.data_ptr() - flat.data_ptr(),
                              "rows": int(view.shape[0]), "row_bytes": int(view.shape[1])}  # fmt: skip
    return out


def _versions() -> dict[str, str | None]:
    fbgemm = None
    for distribution in ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm_gpu"):
        try:
            fbgemm = importlib.metadata.version(distribution)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"lightrec": __version__, "torch": torch.__version__, "fbgemm_gpu": fbgemm}


def _example_inputs(info: ModelContract, batch_size: int = 3) -> tuple[torch.Tensor, ...]:
    """A small valid batch: feature ``f`` of sample ``b`` has ``(f + b) % 3 + 1`` ids (all distinct sizes)."""
    num_features = len(info["feature_names"])
    rows = {f: t["num_embeddings"] for t in info["tables"] for f in t["feature_names"]}
    lengths = torch.tensor([(f + b) % 3 + 1 for f in range(num_features) for b in range(batch_size)])
    values = torch.cat([torch.arange(int(n)) % rows[info["feature_names"][i // batch_size]]
                        for i, n in enumerate(lengths.tolist())])
    dense = torch.zeros(batch_size, info["dense_in_features"] or 0)
    weights = torch.ones(values.shape[0]) if info["is_weighted"] else None
    return (dense, values, lengths) + ((weights,) if weights is not None else ())


def _model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _split_example(example_batch: ExampleBatch, info: ModelContract) -> tuple[torch.Tensor, ...]:
    if isinstance(example_batch, KeyedJaggedTensor):
        dense, kjt = None, example_batch
    elif isinstance(example_batch, (tuple, list)) and len(example_batch) == 2:
        dense, kjt = example_batch
    else:
        raise TypeError(f"example_batch must be (dense_features, kjt) or a kjt, got {type(example_batch).__name__}")
    kjt = kjt.permute_to_keys(info["feature_names"])
    if dense is None:
        dense = torch.zeros(kjt.stride(), info["dense_in_features"] or 0)
    weights = kjt.weights_or_none()
    return (dense, kjt.values(), kjt.lengths()) + ((weights,) if info["is_weighted"] and weights is not None else ())


def export(
    model: nn.Module,
    path: str | os.PathLike,
    format: str = "torchscript",
    example_batch: ExampleBatch | None = None,
    takes_dense: bool | None = None,
    dense_in_features: int | None = None,
    extra_meta: Mapping[str, object] | None = None,
) -> Path:
    """Write a serving artifact of ``model`` to ``path`` and its metadata to ``<path>.meta.json``.

    Both files are written to temporary names in the same folder and moved into place with
    ``os.replace`` (artifact first, metadata last), so a reader never sees a half-written file.

    A model sharded over ranks (a ``DistributedModelParallel``, or a model holding its sharded
    collections) makes this a collective: every rank calls it, the float tables are gathered to
    rank 0 of the sharding group (:func:`lightrec.inference.gather.unshard`), rank 0 writes, and
    every rank returns once the artifact exists (or raises ``ExportError`` if rank 0 failed). To
    export it quantized, ``export(quantize(dmp, dst=0), path)`` on rank 0 after the collective
    ``quantize`` (what the ``QuantizedExport`` callback does).

    Args:
        model: usually ``quantize(model)`` (optionally sharded for inference); a float model works too.
        path: artifact file (``.pt`` for TorchScript, ``.pt2`` for ``torch.export`` by convention).
        format: ``"torchscript"`` or ``"export"``.
        example_batch: ``(dense_features, kjt)`` or ``kjt``; used to check the artifact reproduces the
            model and as export's example input. Default: a small synthetic batch.
        takes_dense: whether ``model`` is called ``model(dense, kjt)``; default: it has a ``DenseArch``
            or its forward takes two arguments.
        dense_in_features: dense width when the model has no ``DenseArch`` to read it from.
        extra_meta: more JSON-serializable entries for the metadata (e.g. epoch and step).

    Returns:
        ``Path(path)``.

    Raises:
        ValueError: unknown ``format``; ExportError: the model cannot be traced/exported (with why),
            or the artifact's output differs from the model's on the example batch.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {format!r}")
    if has_sharded_collections(model):
        group, _, _ = sharding_group(model)
        return export_on_rank(lambda: unshard(model, dst=0), path, group=group, dst=0, format=format,
                              example_batch=example_batch, takes_dense=takes_dense,
                              dense_in_features=dense_in_features, extra_meta=extra_meta)
    path = Path(path)
    _check_destination(path)  # before tracing: a bad path fails in a moment, not after the whole export
    model = model.eval()
    info = describe_model(model, dense_in_features)
    if takes_dense is None:
        takes_dense = len(inspect.signature(model.forward).parameters) >= 2
    if takes_dense and not info["dense_in_features"]:
        if isinstance(example_batch, (tuple, list)):
            info["dense_in_features"] = int(example_batch[0].shape[1])
        else:
            raise ExportError("the model takes dense features but their width is unknown; pass dense_in_features=")
    wrapper = TensorInputModule(model, info["feature_names"], takes_dense, info["is_weighted"]).eval()
    inputs = _split_example(example_batch, info) if example_batch is not None else _example_inputs(info)
    # Trace where the model lives (a model on the GPU, say); `load(path, device=...)` moves the
    # artifact to wherever it is served.
    inputs = tuple(t.to(_model_device(model)) for t in inputs)
    with torch.no_grad():
        expected = wrapper(*inputs)
        if not isinstance(expected, torch.Tensor):
            raise ExportError(f"the model must return one tensor, got {type(expected).__name__}; wrap it in a module "
                              "that turns its output (e.g. a dict of JaggedTensors) into scores")
        if format == "torchscript":
            artifact = _to_torchscript(wrapper)
            got = artifact(*inputs)
            uses_fbgemm = "fbgemm" in _all_code(artifact)
        else:
            program = _to_exported_program(wrapper, inputs)
            got = program.module()(*inputs)
            uses_fbgemm = "fbgemm" in str(program.graph_module.code)
    if not torch.equal(got, expected):
        raise ExportError(f"the {format} artifact's output differs from the model's on the example batch "
                          f"(max abs diff {(got - expected).abs().max().item():.3g}); please report this")
    storage = table_storage(model)
    for table in info["tables"]:
        if table["name"] in storage:
            table["storage"] = storage[table["name"]]
    meta = {
        "format": format,
        "inputs": ["dense_features", "values", "lengths"] + (["weights"] if info["is_weighted"] else []),
        "takes_dense": takes_dense,
        "uses_fbgemm": uses_fbgemm,
        "output": "model output (DLRM: logits [B, 1]); Predictor.predict applies a sigmoid",
        "dtype": sorted({t["data_type"] for t in info["tables"]}),
        "versions": _versions(),
        **info,
        **(extra_meta or {}),
    }
    # One id in both files: the two renames below are not one step, so a reader between them, or an
    # export killed between them, sees a new artifact beside an old metadata file; load() compares
    # the ids and refuses such a pair instead of serving the artifact with another model's contract.
    meta["export_id"] = uuid.uuid4().hex
    stamp = {EXPORT_ID_FILE: meta["export_id"]}
    meta_path = Path(str(path) + ".meta.json")
    if format == "torchscript":
        _write_atomically(path, lambda tmp: torch.jit.save(artifact, str(tmp), _extra_files=stamp))
    else:
        _write_atomically(path, lambda tmp: torch.export.save(program, str(tmp), extra_files=stamp))
    _write_atomically(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
    return path


def export_on_rank(
    build: Callable[[], Optional[nn.Module]],
    path: str | os.PathLike,
    group: dist.ProcessGroup | None = None,
    dst: int = 0,
    format: str = "torchscript",
    example_batch: ExampleBatch | None = None,
    takes_dense: bool | None = None,
    dense_in_features: int | None = None,
    extra_meta: Mapping[str, object] | None = None,
) -> Path:
    """Collective export: every rank runs ``build`` (which may gather), rank ``dst`` exports the model
    it returns to ``path``, then every rank learns whether that worked. The other arguments are
    :func:`export`'s.

    Returns:
        ``Path(path)`` on every rank, once the artifact is written.

    Raises:
        ExportError: on the other ranks when rank ``dst`` failed (rank ``dst`` raises the original error).
    """
    def write(model: nn.Module) -> Path:
        return export(model, path, format=format, example_batch=example_batch, takes_dense=takes_dense,
                      dense_in_features=dense_in_features, extra_meta=extra_meta)

    run_on_rank(build, write, f"export {str(path)!r}", group=group, dst=dst, failure=ExportError)
    return Path(path)


def _check_destination(path: Path) -> None:
    """Raise ``IsADirectoryError`` / ``NotADirectoryError`` naming the culprit when ``path`` cannot be
    written: it is a folder, or one of its would-be folders is a file (``mkdir`` says "File exists")."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{str(path)!r} is a folder; give the artifact's file name "
                                f"(e.g. {str(path / 'model.pt')!r})", str(path))
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{str(parent)!r} is a file, not a folder: {str(path)!r} "
                                         "cannot be written under it", str(parent))
            return


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary file next to ``path``, then move it onto ``path`` (``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the suffix kept last: torch.export.save warns about an archive name not ending in .pt2
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _all_code(module: torch.jit.ScriptModule) -> str:
    code = [module.code]
    for _, sub in module.named_modules():
        try:
            code.append(sub.code)
        except (RuntimeError, AttributeError):
            continue
    return "\n".join(code)


def _to_torchscript(wrapper: nn.Module) -> torch.jit.ScriptModule:
    try:
        graph_module = symbolic_trace(wrapper)
    except Exception as exc:  # fx reports the failing Python line; add what to do
        raise ExportError(f"torch.fx could not trace the model ({type(exc).__name__}: {exc}); control flow on "
                          "tensor values must live in torch.fx.wrap-ed functions") from exc
    try:
        return torch.jit.script(graph_module)
    except Exception as exc:
        raise ExportError(f"torch.jit.script failed on the traced model: {exc}") from exc


def _to_exported_program(
    wrapper: TensorInputModule, inputs: tuple[torch.Tensor, ...]
) -> torch.export.ExportedProgram:
    if any(type(m).__name__ == "IntNBitTableBatchedEmbeddingBagsCodegen" for m in wrapper.modules()):
        raise ExportError(
            "torch.export cannot trace fbgemm's IntNBitTableBatchedEmbeddingBagsCodegen (its AtomicCounter has no "
            "fake class): export the unsharded quantized model, shard with kernel_backend='torch', or use format='torchscript'"
        )
    if any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in wrapper.modules()):
        raise ExportError("dynamic int8 Linear layers (quantize_dense=True) export only as format='torchscript'")
    # Batch 1 is specialized away by torch.export (0/1 specialization), so programs serve B >= 2;
    # Predictor pads a single request to two.
    batch = torch.export.Dim("batch", min=2)
    num_ids = torch.export.Dim("num_ids", min=1)
    num_features = len(wrapper._feature_names)
    shapes: dict[str, Any] = {
        "dense_features": {0: batch},
        "values": {0: num_ids},
        "lengths": {0: batch * num_features},
    }
    if len(inputs) == 4:
        shapes["weights"] = {0: num_ids}
    try:
        return torch.export.export(wrapper, inputs, dynamic_shapes=shapes, strict=False)
    except Exception as exc:
        raise ExportError(f"torch.export failed ({type(exc).__name__}: {exc})") from exc


def export_from_checkpoint(
    checkpoint: str | os.PathLike | dict[str, Any],
    model_factory: Callable[[], nn.Module],
    out_path: str | os.PathLike,
    dtype: object = torch.int8,
    format: str = "torchscript",
    per_table: dict[str, object] | None = None,
    quantize_dense: bool = False,
    example_batch: ExampleBatch | None = None,
) -> Path:
    """Checkpoint (file or full-table state dict) -> quantized serving artifact in one call.

    Args:
        checkpoint: a path to ``torch.save``-d state dict or Lightning checkpoint (its ``"state_dict"``),
            or the state dict itself. Keys may carry a prefix (``"model."``), which is stripped.
            A sharded checkpoint folder (``RecStrategy``) is consolidated into full tables first.
        model_factory: builds the float model (its tables may be on ``meta``; only configs are read).
        out_path, dtype, format, per_table, quantize_dense, example_batch: as in ``quantize``/``export``.

    Returns:
        ``Path(out_path)``.

    Raises:
        FileNotFoundError: no checkpoint at the path; ValueError: keys do not match the model;
        CheckpointError: the file is unreadable, fails its checksums, or holds objects unsafe to load.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        if not Path(checkpoint).exists():
            raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist")
        if is_sharded_checkpoint(checkpoint):  # a RecStrategy folder: gather full tables here
            checkpoint = consolidate_checkpoint(checkpoint)
        else:
            checkpoint = load_file(checkpoint)  # weights_only=True: nothing in the file runs
    if not isinstance(checkpoint, dict):
        raise TypeError(f"checkpoint must be a path or a state dict, got {type(checkpoint).__name__}")
    state = checkpoint.get("state_dict", checkpoint)
    model = model_factory()
    state = _strip_prefix(state, list(model.state_dict().keys()))
    qmodel = quantize(model, dtype=dtype, per_table=per_table, quantize_dense=quantize_dense, state_dict=state)
    return export(qmodel, out_path, format=format, example_batch=example_batch)


def _strip_prefix(state: dict[str, torch.Tensor], model_keys: list[str]) -> dict[str, torch.Tensor]:
    """Drop the prefix (``"model."``, ``"module."``...) that maps the checkpoint's keys onto the model's."""
    if all(k in state for k in model_keys):
        return state
    probe = model_keys[0]
    for key in state:
        if key.endswith(probe):
            prefix = key[: len(key) - len(probe)]
            stripped = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            if all(k in stripped for k in model_keys):
                return stripped
    missing = [k for k in model_keys if k not in state][:5]
    raise ValueError(f"the checkpoint's keys do not match the model's (e.g. missing {missing}; checkpoint has "
                     f"{list(state)[:5]}...); build the model with the same model_factory that trained it")
