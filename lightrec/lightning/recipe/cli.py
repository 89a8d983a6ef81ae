"""The LightningCLI every recipe runs: table linking, default config, end-of-fit test, summary, export.

Public API for recipes (``recipes/*.py`` and the copies ``lightrec cp`` writes import it as it is).
``run_recipe(DLRMModule, "dlrm.yaml", __file__, args)`` is a recipe's whole ``main``:

1. a config name (``--config dlrm_criteo``) resolves to ``<recipe dir>/configs/dlrm_criteo.yaml``,
   and with no ``--config`` at all the recipe's default config is used;
2. ``RecipeCLI`` links the DataModule's dense width into the model's ``dense_in_features``
   (``link_arguments(..., apply_on="instantiate")``); the tables are sized from the DataModule in
   ``configure_model``, after ``prepare_data`` / ``setup`` (``RecipeModule``), so a config never
   repeats the data's cardinalities and data prepared inside the run sizes them;
3. after ``fit`` it runs the test set (``recipe.test_after_fit``), prints the test metrics — for
   synthetic data with the Bayes-optimal AUC and the fraction of the gap from 0.5 reached — and
   where the TensorBoard logs and checkpoints are; with ``recipe.export`` on, a
   ``QuantizedExport`` callback writes a quantized serving artifact at the end of training
   (sharded runs included: every rank joins the gather of the full tables, rank 0 writes).
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, SupportsFloat

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

# importing lightrec.lightning registers RecStrategy as strategy "lightrec" before a config names it
import lightrec.lightning  # noqa: F401
from lightrec import _switches
from lightrec.lightning.callbacks.quantized_export import QuantizedExport
from lightrec.lightning.rec_module import RecModule
from lightrec.lightning.recipe.checks import (
    CHECKED_ENV,
    RecipeArgumentError,
    check_recipe_args,
    print_warning,
    warn_if_devices_exceed_cores,
)
from lightrec.lightning.recipe.module import dense_width_of

__all__ = [
    "RecipeCLI",
    "RecipeOptions",
    "fabric_run_overrides",
    "resolve_config_args",
    "run_recipe",
    "summarize",
    "with_launcher_overrides",
]

SUBCOMMANDS = ("fit", "validate", "test", "predict")
USAGE_ERROR = 2
#: Short names for ``--data`` (``lightrec run dlrm --data parquet --data.path logs/ --data.label click``).
DATA_SHORTCUTS = {
    "parquet": "lightrec.data.ParquetDataModule",
    "synthetic": "lightrec.data.SyntheticCriteo",
    "criteo": "lightrec.data.CriteoDataModule",
    "movielens": "lightrec.data.MovieLensDataModule",
}


@dataclass
class RecipeOptions:
    """What a recipe does around ``Trainer.fit`` (the ``recipe:`` section of a config).

    Args:
        test_after_fit: evaluate the test split after training and print the summary.
        export: write a quantized inference artifact after training (needs ``lightrec.inference``).
        export_dtype: ``"int8"``, ``"int4"`` or ``"fp16"`` embedding tables in the artifact.
        export_format: ``"torchscript"`` or ``"export"`` (``torch.export``).
        export_dir: where the artifact goes (default: ``<log dir>/export``).
    """

    test_after_fit: bool = True
    export: bool = False
    export_dtype: Literal["int8", "int4", "fp16"] = "int8"
    export_format: Literal["torchscript", "export"] = "torchscript"
    export_dir: str | None = None


def _has_config(args: list[str]) -> bool:
    return any(a in ("--config", "-c") or a.startswith(("--config=", "-c=")) for a in args)


def resolve_config_args(args: list[str], configs_dir: Path, default_config: str) -> list[str]:
    """Default subcommand ``fit``, default config, and config names resolved to files of ``configs_dir``.

    ``["fit"]`` -> ``["fit", "--config", <configs_dir>/<default_config>]``; ``--config dlrm_criteo``
    -> ``--config <configs_dir>/dlrm_criteo.yaml`` when that file exists (paths are kept as given);
    ``--data parquet`` -> ``--data lightrec.data.ParquetDataModule`` (:data:`DATA_SHORTCUTS`).
    """
    args = list(args)
    if not args or args[0].startswith("-") and not any(a in ("-h", "--help") for a in args):
        args.insert(0, "fit")
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--config", "-c") and i + 1 < len(args):
            out += [a, _config_file(args[i + 1], configs_dir)]
            i += 2
            continue
        if a == "--data" and i + 1 < len(args):
            out += [a, DATA_SHORTCUTS.get(args[i + 1], args[i + 1])]
            i += 2
            continue
        if a.startswith("--data="):
            out.append("--data=" + DATA_SHORTCUTS.get(a[len("--data=") :], a[len("--data=") :]))
        elif a.startswith(("--config=", "-c=")):
            flag, value = a.split("=", 1)
            out.append(f"{flag}={_config_file(value, configs_dir)}")
        else:
            out.append(a)
        i += 1
    if out and out[0] in SUBCOMMANDS and not _has_config(out) and not any(a in ("-h", "--help") for a in out):
        out[1:1] = ["--config", str(configs_dir / default_config)]
    return out


# `fabric run` (Lightning's launcher, lightning.fabric.cli) starts a script under torchrun and hands
# its --accelerator / --devices / --num-nodes / --precision to the processes in LT_* variables that
# only Fabric reads. A recipe's Trainer takes them as overrides of its config, so the launcher's
# flags mean what they say (`fabric run --devices 1 recipes/dlrm.py` is one process, not a Trainer
# waiting for the second rank its config names). Its --strategy is not taken: Fabric's strategy
# names are not the Trainer's, and the configs' `strategy: lightrec` is what shards the tables.
_FABRIC_RUN_ENV = (
    ("LT_ACCELERATOR", "accelerator"),
    ("LT_DEVICES", "devices"),
    ("LT_NUM_NODES", "num_nodes"),
    ("LT_PRECISION", "precision"),
)


def fabric_run_overrides(environ: Mapping[str, str]) -> list[str]:
    """``--trainer.<key>=<value>`` for each setting ``fabric run`` passed (empty outside ``fabric run``)."""
    if environ.get("LT_CLI_USED") != "1":
        return []
    return [f"--trainer.{key}={environ[var]}" for var, key in _FABRIC_RUN_ENV if environ.get(var)]


def with_launcher_overrides(args: list[str], overrides: list[str]) -> list[str]:
    """``args`` with ``overrides`` placed after the subcommand and its configs: they win over the
    configs, and the options the user typed (after them) win over both."""
    if not overrides or not args or args[0] not in SUBCOMMANDS:
        return args
    at = 1
    while at < len(args) and (args[at] in ("--config", "-c") or args[at].startswith(("--config=", "-c="))):
        at += 1 if "=" in args[at] else 2
    return [*args[:at], *overrides, *args[at:]]


def _config_file(value: str, configs_dir: Path) -> str:
    if Path(value).is_file():
        return value
    name = value if value.endswith((".yaml", ".yml")) else value + ".yaml"
    candidate = configs_dir / name
    return str(candidate) if candidate.is_file() and "/" not in value else value


class RecipeCLI(LightningCLI):
    """``LightningCLI`` for recipes: data-linked tables, ``recipe:`` options, end-of-fit summary."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RecipeOptions, "recipe")
        params = inspect.signature(self._model_class).parameters
        if "dense_in_features" in params:
            parser.link_arguments(
                "data", "model.dense_in_features", compute_fn=dense_width_of, apply_on="instantiate"
            )

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        options = self._options()
        tiering = self.model.table_tiering if isinstance(self.model, RecModule) else None
        if options.export and tiering is not None and tiering.tiered:
            rank_zero_info(
                f"recipe: no export -- the tables are tiered (tables_on={tiering.tables_on!r}: their rows live "
                "behind a cache and a serving artifact would hold them all in memory; docs/tiered-tables.md)"
            )
        elif options.export and self.subcommand in (None, "fit"):
            # A callback, not a step after fit: it runs in on_train_end, while a sharded model and
            # its process group are still set up, so the full tables can be gathered.
            _callbacks(trainer).append(
                QuantizedExport(dirpath=options.export_dir, dtype=options.export_dtype, format=options.export_format)
            )
        return trainer

    def _options(self) -> RecipeOptions:
        section = self.config_init[self.subcommand] if self.subcommand else self.config_init
        options = section.get("recipe")
        return options if isinstance(options, RecipeOptions) else RecipeOptions()

    def before_fit(self) -> None:
        ckpt = self._subcommand_value("ckpt_path")
        if ckpt and self.trainer.is_global_zero:
            print(resume_note(str(ckpt), self.trainer), flush=True)

    def _subcommand_value(self, key: str) -> object:
        section = self.config[self.subcommand] if self.subcommand else self.config
        return section.get(key)

    def after_fit(self) -> None:
        options = self._options()
        if options.test_after_fit and not self.trainer.interrupted:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)
        if self.trainer.is_global_zero:
            print(summarize(self.trainer, self.datamodule, tested=options.test_after_fit), flush=True)


def resume_note(ckpt_path: str, trainer: pl.Trainer) -> str:
    """One line for a resumed run: where it resumes from and where its logs and checkpoints go."""
    where = [getattr(trainer.logger, "log_dir", None) if trainer.logger is not None else None]
    ckpt = trainer.checkpoint_callback
    where.append(getattr(ckpt, "dirpath", None) if ckpt is not None else None)
    shown = [w for w in where if w]
    target = f"; this run writes to {shown[0]}" if shown else ""
    return f"Resuming from {ckpt_path}{target} (a new version folder: the checkpoint's own stays as it is)"


def _callbacks(trainer: pl.Trainer) -> list[pl.Callback]:
    """``trainer.callbacks`` (set by Lightning's callback connector, so invisible to type checkers)."""
    callbacks: list[pl.Callback] = getattr(trainer, "callbacks")  # noqa: B009
    return callbacks


def _fmt(value: SupportsFloat) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return str(value)


def summarize(trainer: pl.Trainer, datamodule: object, tested: bool = True) -> str:
    """End-of-run report: test metrics, Bayes-optimal AUC (synthetic data), log and checkpoint paths."""
    lines = ["", "=" * 72, "lightrec recipe finished"]
    metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
    if tested and metrics:
        lines.append("  test: " + "  ".join(f"{k[5:]}={_fmt(v)}" for k, v in sorted(metrics.items())))
    elif tested:
        lines.append("  test: no test metrics were logged")
    online = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("online/")}
    if online:  # ProgressiveValidation: the newest window of batches, each scored before it trained
        lines.append("  online (last window): " + "  ".join(f"{k[7:]}={_fmt(v)}" for k, v in sorted(online.items())))
    bayes = getattr(datamodule, "bayes_optimal_auc", None)
    if callable(bayes) and "test/auc" in metrics:
        auc, best = float(metrics["test/auc"]), float(bayes())
        gap = (auc - 0.5) / (best - 0.5) if best > 0.5 else float("nan")
        lines.append(
            f"  Bayes-optimal AUC of the synthetic data: {best:.4f}; this model reached "
            f"{gap:.1%} of the way from 0.5 to it"
        )
    logger = trainer.logger
    if logger is not None and getattr(logger, "log_dir", None):
        lines.append(f"  TensorBoard logs: {logger.log_dir}   (tensorboard --logdir {logger.save_dir})")
    ckpt = trainer.checkpoint_callback
    if ckpt is not None:
        best_path = getattr(ckpt, "best_model_path", "") or getattr(ckpt, "last_model_path", "")
        lines.append(f"  checkpoint: {best_path or '(none written)'}")
        last = getattr(ckpt, "last_model_path", "")
        if last and last != best_path:
            lines.append(f"  last checkpoint: {last}")
    exported = [p for cb in _callbacks(trainer) for p in getattr(cb, "paths", []) if isinstance(cb, QuantizedExport)]
    if exported:
        lines.append(f"  exported model: {exported[-1]}   (lightrec.inference.load or torch.jit.load)")
    lines.append("=" * 72)
    return "\n".join(lines)


class _PlanCLI(RecipeCLI):
    """Parses a config and builds model and data, but no Trainer (planning needs no accelerator)."""

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        return None


def plan_cli(recipe_module: ModuleType, config: str, overrides: list[str]) -> RecipeCLI:
    """Model and DataModule of ``config`` for a recipe module, without a Trainer (``lightrec plan``)."""
    classes = [
        v
        for v in vars(recipe_module).values()
        if isinstance(v, type) and issubclass(v, RecModule) and v.__module__ == recipe_module.__name__
    ]
    if len(classes) != 1:
        raise TypeError(f"{recipe_module.__name__} must define exactly one RecModule subclass, found {classes}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        return _PlanCLI(
            classes[0],
            pl.LightningDataModule,
            subclass_mode_data=True,
            seed_everything_default=0,
            args=["--config", config, *overrides],
            run=False,
        )


_COMMAND_PROG: ContextVar[str | None] = ContextVar("lightrec_recipe_prog", default=None)


@contextmanager
def command_prog(prog: str) -> Iterator[None]:
    """Within this block a recipe's ``--help`` and usage errors name ``prog`` (``lightrec run dlrm``):
    ``lightrec run`` sets it, where LightningCLI would name ``sys.argv[0]`` (``lightrec [options] fit``)
    and the recipe's position in ``sys.argv`` depends on the options before it (``--devices 1 dlrm``)."""
    token = _COMMAND_PROG.set(prog)
    try:
        yield
    finally:
        _COMMAND_PROG.reset(token)


def _prog_kwargs() -> dict[str, str]:
    """LightningCLI's ``parser_kwargs``: ``{"prog": ...}`` inside :func:`command_prog`, else nothing."""
    prog = _COMMAND_PROG.get()
    return {} if prog is None else {"prog": prog}


def run_recipe(
    module_class: type[pl.LightningModule],
    default_config: str,
    recipe_file: str,
    args: list[str] | None = None,
) -> RecipeCLI:
    """A recipe's ``main``: parse ``args`` (default ``sys.argv[1:]``), build everything, run the subcommand.

    Args:
        module_class: the recipe's ``RecModule`` subclass.
        default_config: file name in ``<dir of recipe_file>/configs`` used when no ``--config`` is given.
        recipe_file: the recipe's ``__file__`` (configs are found next to it, also in a ``lightrec cp`` copy).
        args: LightningCLI arguments; a leading subcommand is optional (``fit`` by default).
    """
    configs_dir = Path(recipe_file).resolve().parent / "configs"
    raw = resolve_config_args(list(sys.argv[1:] if args is None else args), configs_dir, default_config)
    raw = with_launcher_overrides(raw, fabric_run_overrides(os.environ))
    # The launching process checks; the ranks Lightning starts inherit CHECKED_ENV, and under
    # torchrun only global rank 0 checks (the others stop when it exits), so a mistake prints once.
    checked = _switches.ARGS_CHECKED.read() or os.environ.get("RANK", "0") != "0"
    if not checked:
        try:
            requested = check_recipe_args(RecipeCLI, module_class, raw, configs_dir)
        except RecipeArgumentError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(USAGE_ERROR) from None
        if requested is not None:
            print_warning(warn_if_devices_exceed_cores(requested))
            for note in requested.notes:
                print_warning(note)
        # The environment, because it must reach the ranks Lightning's subprocess launcher starts: they
        # re-run this command line in new processes, and this variable is how they know it was checked.
        os.environ[CHECKED_ENV] = "1"
    try:
        with warnings.catch_warnings():
            # `lightrec run` passes the recipe's arguments explicitly while sys.argv holds its own.
            warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
            # A resumed run logs into a new version folder: ModelCheckpoint's "The dirpath has changed
            # ... won't be reloaded" is expected and nothing to act on; before_fit says where it goes.
            warnings.filterwarnings("ignore", message=r"The dirpath has changed from", module=r"lightning\.")
            return RecipeCLI(
                module_class,
                pl.LightningDataModule,
                subclass_mode_data=True,
                save_config_kwargs={"overwrite": True},
                seed_everything_default=0,
                args=raw,
                parser_kwargs=_prog_kwargs(),
            )
    finally:
        if not checked:
            os.environ.pop(CHECKED_ENV, None)
