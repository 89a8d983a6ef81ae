"""``lightrec export <checkpoint>``: quantize a recipe checkpoint into a serving artifact.

The checkpoint names its ``RecModule`` class (``lightrec_module``); the class rebuilds the model
(``serving_factory``) and ``lightrec.inference.export_from_checkpoint`` writes the artifact. A class
the checkpoint names by a file (``path/to/recipe.py:Class``, a recipe run as a script) is imported only
when the user names it with ``--module``: a checkpoint does not choose which file runs. A
sharded checkpoint folder is consolidated into full tables (in a temporary file) first.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from lightrec.cli.common import (
    CommandError,
    UsageError,
    checkpoint_argument,
    command_parser,
    reject_extra_arguments,
)

if TYPE_CHECKING:  # annotation only: importing Lightning would slow every command down by seconds
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


def load_class(reference: str, source: str = "--module") -> type[RecModule]:
    """The ``RecModule`` class a checkpoint names: ``package.module.Class`` or ``path/to/file.py:Class``.

    Args:
        reference: the class reference.
        source: where it came from (``--module``, or the checkpoint's ``lightrec_module`` entry), for messages.

    Raises:
        UsageError: the reference is malformed, names nothing importable, or not a LightningModule class.
    """
    def refused(why: str) -> UsageError:
        return UsageError(
            f"{source} {reference!r} {why}; name the checkpoint's RecModule class with --module "
            "package.module.Class or --module path/to/file.py:Class"
        )

    try:
        if ":" in reference:
            path, name = reference.rsplit(":", 1)
            if not Path(path).is_file() or not name:
                raise refused(f"names file {path!r}, which does not exist" if not Path(path).is_file()
                              else "names no class after ':'")
            spec = importlib.util.spec_from_file_location(Path(path).stem, path)
            if spec is None or spec.loader is None:
                raise refused(f"names {path!r}, which is not a Python file")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module_name, _, name = reference.rpartition(".")
            if not module_name or not name or "" in reference.split("."):  # "Foo", ".Foo", "pkg.", "a..B"
                raise refused("is not a dotted class path")
            module, name = _import_dotted(reference)
    except UsageError:
        raise
    except (ImportError, OSError, SyntaxError, ValueError) as exc:
        # What an import can raise for a stale or mistyped reference; the module's own errors too.
        raise refused(f"cannot be imported ({type(exc).__name__}: {exc})") from exc
    found: object = module
    for i, part in enumerate(name.split(".")):  # a class nested in a class: Outer.Inner (its __qualname__)
        found = getattr(found, part, None)
        if found is None:
            owner = ".".join([module.__name__, *name.split(".")[:i]])
            raise refused(f"names nothing: {owner} has no attribute {part!r}")
    from lightning.pytorch import LightningModule  # only now: Lightning takes a second to import

    if not isinstance(found, type):
        raise refused(f"is a {type(found).__name__}, not a class")
    if not issubclass(found, LightningModule):  # load_from_checkpoint is a LightningModule classmethod
        raise refused(f"is class {found.__qualname__}, not a RecModule (LightningModule) subclass")
    return cast("type[RecModule]", found)


def _import_dotted(reference: str) -> tuple[ModuleType, str]:
    """``(module, attribute path)`` of ``package.module.Class`` (or ``package.module.Outer.Inner``): the
    longest prefix that is a module, looked up as ``python -m`` would, the current folder included (the
    ``lightrec`` console script's ``sys.path`` starts with its own bin folder, not the current one, so a
    ``mymodels.MyRec`` next to the user's training script was not found).

    Raises:
        ImportError: no prefix is a module (the error of the shortest one), or a module's own import failed.
    """
    parts = reference.split(".")
    cwd = os.getcwd()
    added = not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path)
    if added:
        sys.path.insert(0, cwd)
    try:
        missing: ModuleNotFoundError | None = None
        for cut in range(len(parts) - 1, 0, -1):
            module_name = ".".join(parts[:cut])
            try:
                return importlib.import_module(module_name), ".".join(parts[cut:])
            except ModuleNotFoundError as exc:
                if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
                    raise  # the module exists, but something it imports does not
                missing = exc
        assert missing is not None
        raise missing
    finally:
        if added:
            sys.path.remove(cwd)


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    checkpoint = Path(ns.checkpoint)
    checkpoint_argument(checkpoint)
    suffix = "pt2" if ns.format == "export" else "pt"
    out = Path(ns.out) if ns.out else checkpoint.parent / f"{checkpoint.stem}_{ns.dtype}.{suffix}"
    if checkpoint.is_dir():
        from lightrec.distributed.checkpoint import CheckpointError, consolidate_checkpoint

        with tempfile.TemporaryDirectory() as tmp:  # the whole model is gathered in this process
            full = Path(tmp) / "full.ckpt"
            try:
                consolidate_checkpoint(checkpoint, full)
            except CheckpointError as exc:
                raise CommandError(str(exc)) from exc
            return _export_file(ns, full, out, shown=checkpoint)
    return _export_file(ns, checkpoint, out, shown=checkpoint)


def _export_file(ns: argparse.Namespace, checkpoint: Path, out: Path, shown: Path) -> int:
    from lightrec.distributed.checkpoint import CheckpointError, load_file  # only for this command
    from lightrec.inference import export_from_checkpoint

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
    if not ns.module and ":" in reference:
        # A file named by the checkpoint would run as the export imports it: a checkpoint from elsewhere must
        # not decide what code runs here (the file itself is read with weights_only=True for that reason).
        raise UsageError(
            f"{str(shown)!r} names its RecModule class by a file ({reference!r}), which lightrec does not run on "
            f"a checkpoint's word; if you trust that file, name it yourself: lightrec export {shown} --module {reference}"
        )
    source = "--module" if ns.module else f"the checkpoint's lightrec_module entry ({str(shown)!r})"
    rec_module = load_class(reference, source).load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
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
