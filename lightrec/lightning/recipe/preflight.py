"""Checks of a parsed recipe command line that need its model, DataModule and checkpoint (issue 23).

:func:`lightrec.lightning.recipe.checks.check_recipe_args` parses the command line and builds the model
and DataModule in the launching process; :func:`check_built_run` then looks for the mistakes that
would otherwise stop every rank with a traceback, or end the run early without an error:

* ``--accelerator gpu`` on a machine where torch sees no CUDA device;
* the wrong kind of data for the recipe (``RecipeModule.check_datamodule``: ``two_tower`` on click
  data, ...);
* fewer batches than ranks (a rank without a batch: Lightning ended the fit at once, untrained,
  exit 0), for DataModules whose datasets exist before any data is read (the synthetic ones; the
  others' loaders refuse it on every rank, ``RankBatchSampler``);
* ``--ckpt_path`` of another recipe's checkpoint (LightningCLI printed its whole usage, or every rank
  failed on the tables), and ``--model.*`` options that differ from the checkpoint's model: LightningCLI
  takes a checkpoint file's hyperparameters over the command line (the option was silently ignored),
  and a sharded checkpoint does not fit a model built otherwise.

Each raises :class:`~lightrec.lightning.recipe.checks.RecipeArgumentError` with one line. One case is a
warning, returned for the caller to print: resuming on another number of ranks with the same
per-rank ``batch_size`` changes the global batch (the rest of the epoch is the same samples, in steps
of another size).

What a checkpoint says about its run (:func:`checkpoint_entries`: the module class that wrote it,
its hyperparameters, the world size and the DataModule's batch size) is read without its tables:
for a sharded folder only ``meta.pt`` (verified against the manifest); a file is memory-mapped, so
its tensors are not read. Nothing is unpickled with code execution (``weights_only=True``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI

from lightrec.distributed.checkpoint import is_sharded_checkpoint, load_file
from lightrec.distributed.checkpoint.files import read_meta
from lightrec.lightning.recipe.module import RecipeModule

__all__ = ["check_built_run", "checkpoint_entries"]

_GPU_ACCELERATORS = ("gpu", "cuda")


def checkpoint_entries(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's top-level entries (``lightrec_module``, ``hyper_parameters``,
    ``datamodule_hyper_parameters``, ``lightrec_sharded`` with the world size of a folder, ...).

    Raises:
        CheckpointError: a damaged or foreign sharded folder, or a file that is not a safe checkpoint.
        OSError: the path cannot be read.
    """
    meta = read_meta(path) if is_sharded_checkpoint(path) else load_file(path, mmap=True)
    return meta if isinstance(meta, dict) else {}


def check_built_run(cli: LightningCLI, user_args: list[str], ckpt_path: str | None, error: type[Exception]) -> list[str]:
    """Raise ``error`` (one line) for a mistake of a parsed, built command line (module docstring).

    Args:
        cli: the LightningCLI with ``model``, ``datamodule`` and ``config`` (no Trainer).
        user_args: the command line's own arguments (for the ``--model.*`` options it sets).
        ckpt_path: ``--ckpt_path``, or None.
        error: the exception type to raise (``RecipeArgumentError``).

    Returns:
        Warning lines to print (the run can go on).
    """
    trainer = cli.config.get("trainer", {})
    _check_accelerator(str(trainer.get("accelerator", "auto")), error)
    if isinstance(cli.model, RecipeModule) and cli.datamodule is not None:
        try:
            cli.model.check_datamodule(cli.datamodule)
        except ValueError as exc:
            raise error(str(exc)) from exc
    _check_batches_per_rank(cli.datamodule, trainer.get("devices"), trainer.get("num_nodes"), error)
    if ckpt_path and Path(ckpt_path).exists():
        meta = _check_checkpoint(Path(ckpt_path), cli, user_args, error)
        _check_strategy_reads(Path(ckpt_path), trainer.get("strategy"), error)
        note = _global_batch_note(meta, _data_batch_size(cli), trainer)
        return [note] if note else []
    return []


def _check_accelerator(accelerator: str, error: type[Exception]) -> None:
    if accelerator.lower() not in _GPU_ACCELERATORS:
        return
    import torch

    if not torch.cuda.is_available():
        raise error(
            f"--accelerator {accelerator} but torch {torch.__version__} sees no CUDA device on this machine; use "
            "--accelerator cpu (the default configs' setting), or install a CUDA build of torch on a GPU machine"
        )


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, (list, tuple)):
        return len(value)
    if isinstance(value, str) and "," in value:
        return len([v for v in value.split(",") if v.strip()])
    return None  # "auto", -1: resolved by Lightning


def _check_batches_per_rank(datamodule: object, devices: object, num_nodes: object, error: type[Exception]) -> None:
    ranks = (_count(devices) or 1) * (_count(num_nodes) or 1)
    if ranks < 2 or datamodule is None:
        return
    datasets = getattr(datamodule, "datasets", None)  # built at init by the synthetic DataModules only
    if not isinstance(datasets, dict):
        return
    for split, dataset in datasets.items():
        batches = len(dataset) if hasattr(dataset, "__len__") else 0
        if 0 < batches < ranks:
            raise error(
                f"the {split} data has {batches} batch(es), fewer than the {ranks} ranks: every rank needs at least one "
                f"of it; use at most {batches} device(s), or more batches"
            )


def _class_name(reference: str) -> str:
    """``"pkg.mod.Class"`` or ``"/path/recipe.py:Class"`` -> ``"Class"``."""
    return reference.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def _check_checkpoint(path: Path, cli: LightningCLI, user_args: list[str], error: type[Exception]) -> dict[str, Any]:
    try:
        meta = checkpoint_entries(path)
    except (RuntimeError, OSError) as exc:  # CheckpointError is a RuntimeError
        raise error(f"--ckpt_path {os.fspath(path)!r} cannot be read: {exc}") from exc
    saved_by = meta.get("lightrec_module")
    model_class = type(cli.model).__name__
    if isinstance(saved_by, str) and _class_name(saved_by) != model_class:
        raise error(
            f"--ckpt_path {os.fspath(path)!r} was written by {saved_by}, not by this recipe's {model_class}: resume it "
            "with the recipe that wrote it (lightrec run <that recipe> --ckpt_path ...)"
        )
    saved = meta.get("hyper_parameters")
    if not isinstance(saved, dict):
        return meta
    model_config = cli.config.get("model", {})
    for arg in user_args:
        key = arg.partition("=")[0]
        if not key.startswith("--model."):
            continue
        name = key[len("--model.") :].removeprefix("init_args.")
        if name in saved and name in model_config and model_config[name] != saved[name]:
            raise error(
                f"{key} {model_config[name]!r} differs from the checkpoint's {name}={saved[name]!r}: a resumed run "
                "keeps the model it resumes (LightningCLI takes a checkpoint's hyperparameters over the command "
                f"line); drop {key} to resume, or start a new run without --ckpt_path"
            )
    return meta


def _data_batch_size(cli: LightningCLI) -> object:
    """``data.init_args.batch_size`` of the parsed config (every lightrec DataModule takes one), or None."""
    data = cli.config.get("data")
    init_args = getattr(data, "init_args", None) if data is not None else None
    return getattr(init_args, "batch_size", None) if init_args is not None else None


def _check_strategy_reads(path: Path, strategy: object, error: type[Exception]) -> None:
    """A sharded checkpoint folder is read by ``RecStrategy`` only (Lightning's strategies torch.load a file)."""
    if not is_sharded_checkpoint(path):
        return
    name = strategy if isinstance(strategy, str) else getattr(strategy, "class_path", None) or type(strategy).__name__
    if "lightrec" in str(name).lower() or "RecStrategy" in str(name):
        return
    raise error(
        f"--ckpt_path {os.fspath(path)!r} is a sharded checkpoint folder, which only the lightrec strategy reads "
        f"(--trainer.strategy {name} cannot: 'Is a directory'); resume with --trainer.strategy lightrec (on any number "
        "of devices, 1 included), or consolidate it into one file first (lightrec consolidate)"
    )


def _global_batch_note(meta: dict[str, Any], batch: object, trainer: Any) -> str | None:
    """A warning when the resumed run's global batch (ranks x batch_size) differs from the checkpoint's."""
    sharded = meta.get("lightrec_sharded")
    saved_ranks = sharded.get("world_size") if isinstance(sharded, dict) else None
    saved_batch = (meta.get("datamodule_hyper_parameters") or {}).get("batch_size")
    ranks = (_count(trainer.get("devices")) or 1) * (_count(trainer.get("num_nodes")) or 1)
    if not (isinstance(saved_ranks, int) and isinstance(saved_batch, int) and isinstance(batch, int)):
        return None
    saved_global, global_batch = saved_ranks * saved_batch, ranks * batch
    if saved_global == global_batch:
        return None
    return (
        f"warning: the checkpoint was trained on {saved_ranks} rank(s) x batch_size {saved_batch} (a global batch of "
        f"{saved_global}); this run has {ranks} x {batch} ({global_batch}): the rest of the epoch is the same samples "
        f"in steps of another size; to train as before pass --data.init_args.batch_size {saved_global // ranks}"
        + ("" if saved_global % ranks == 0 else " (rounded)")
    )
