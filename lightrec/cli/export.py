"""``lightrec export <checkpoint>``: quantize a recipe checkpoint into a serving artifact.

The checkpoint names its ``RecModule`` class (``lightrec_module``); the class rebuilds the model
(``serving_factory``) and ``lightrec.inference.export_from_checkpoint`` writes the artifact. A
sharded checkpoint folder is consolidated into full tables (in a temporary file) first.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from lightrec.cli.common import (
    CommandError,
    UsageError,
    checkpoint_argument,
    command_parser,
    reject_extra_arguments,
)
from lightrec.distributed.checkpoint import CheckpointError, consolidate_checkpoint, load_file
from lightrec.inference import export_from_checkpoint

if TYPE_CHECKING:  # annotation only: importing Lightning would slow every command down by a second
    from lightrec.lightning import RecModule

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(sub, "export", "quantize a recipe checkpoint and write a serving artifact")
    parser.add_argument("checkpoint", help="a .ckpt written by a recipe (a file, or a sharded checkpoint folder)")
    parser.add_argument("--out", help="artifact path (default: next to the checkpoint)")
    parser.add_argument("--dtype", choices=["int8", "int4", "fp16"], default="int8")
    parser.add_argument("--format", choices=["torchscript", "export"], default="torchscript")
    parser.add_argument("--module", help="RecModule class (package.module.Class) if the checkpoint names none")
    return parser


def load_class(reference: str) -> type[RecModule]:
    """The ``RecModule`` class a checkpoint names: ``package.module.Class`` or ``path/to/file.py:Class``."""
    if ":" in reference:
        path, name = reference.rsplit(":", 1)
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        if spec is None or spec.loader is None:
            raise CommandError(f"cannot import the recipe file {path!r} named in the checkpoint")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found: type[RecModule] = getattr(module, name)
        return found
    module_name, _, name = reference.rpartition(".")
    found = getattr(importlib.import_module(module_name), name)
    return found


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    checkpoint = Path(ns.checkpoint)
    checkpoint_argument(checkpoint)
    suffix = "pt2" if ns.format == "export" else "pt"
    out = Path(ns.out) if ns.out else checkpoint.parent / f"{checkpoint.stem}_{ns.dtype}.{suffix}"
    if checkpoint.is_dir():
        with tempfile.TemporaryDirectory() as tmp:  # the whole model is gathered in this process
            full = Path(tmp) / "full.ckpt"
            try:
                consolidate_checkpoint(checkpoint, full)
            except CheckpointError as exc:
                raise CommandError(str(exc)) from exc
            return _export_file(ns, full, out, shown=checkpoint)
    return _export_file(ns, checkpoint, out, shown=checkpoint)


def _export_file(ns: argparse.Namespace, checkpoint: Path, out: Path, shown: Path) -> int:
    try:
        state = load_file(checkpoint)  # weights_only=True: nothing in the file runs
    except CheckpointError as exc:
        raise CommandError(str(exc)) from exc
    reference = ns.module or state.get("lightrec_module")
    if not reference:
        raise UsageError(
            f"{str(shown)!r} was not written by a lightrec recipe (no 'lightrec_module' entry); "
            "pass --module package.module.ClassName of its RecModule"
        )
    rec_module = load_class(reference).load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    serving_factory = getattr(rec_module, "serving_factory", None)
    if not callable(serving_factory):
        raise CommandError(
            f"{reference} has no serving_factory() method (what builds the model to quantize); export "
            "checkpoints of lightrec recipes, or add the method to your RecModule"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        export_from_checkpoint(state, serving_factory, out, dtype=ns.dtype, format=ns.format)
    except OSError as exc:  # e.g. a full disk: one line naming the file, not a traceback
        raise CommandError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    print(f"exported {shown} -> {out}")
    return 0
