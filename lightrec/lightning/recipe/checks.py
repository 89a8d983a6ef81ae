"""A recipe's arguments checked in the launching process, before any rank starts (public API for recipes).

``run_recipe`` calls :func:`check_recipe_args` first. It parses the command line and the config
the way the recipe's ``LightningCLI`` will, builds the model and DataModule (cheap: nothing is
read, no table is allocated), and checks what would otherwise fail only on every rank, after
the processes started: config files, keys (with the nearest valid key, "did you mean"), values
(the classes' own typed errors), ``--ckpt_path``, and whether the data is there
(``DataModule.check_data()``, which names the download URL), then what needs the built model, data and
checkpoint (:mod:`lightrec.lightning.recipe.preflight`: accelerator, kind of data, batches per rank, the
checkpoint of ``--ckpt_path`` against the recipe and its ``--model.*`` options). A problem raises
:class:`RecipeArgumentError` with a one-line message, which ``run_recipe`` prints before exiting
with code 2. It also warns when more CPU processes are asked for than the machine has cores.

The processes Lightning launches for the other ranks inherit ``LIGHTREC_ARGS_CHECKED=1`` and do not
check again.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightrec import _switches
from lightrec._suggest import nearest
from lightrec.lightning.contracts import CheckedData
from lightrec.lightning.recipe.preflight import check_built_run

__all__ = ["CHECKED_ENV", "RecipeArgumentError", "RequestedDevices", "check_recipe_args", "condense_error", "nearest"]

CHECKED_ENV = _switches.ARGS_CHECKED.name
"""Set to ``1`` in the environment of the rank processes of a checked command line (``lightrec._switches``)."""

# Options of the fit/validate/test/predict subcommands (not of the parser that builds the classes).
_SUBCOMMAND_OPTIONS = ("--ckpt_path", "--verbose", "--return_predictions", "--weights_only")


class RecipeArgumentError(ValueError):
    """A recipe's command line or config cannot run; the message is one line a user can act on."""


@dataclass(frozen=True)
class RequestedDevices:
    """The processes the checked command line asks for: ``devices`` per node on ``accelerator``."""

    devices: int | str | list[int]  # as Lightning's Trainer(devices=...) takes it
    accelerator: str
    notes: tuple[str, ...] = ()  # warnings to print before the run starts


@contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's INFO lines ("Seed set to 0") and warnings of a parse whose objects are thrown away."""
    disabled = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)


def _split_subcommand_options(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``args`` without the subcommand and its own options, and those options' values."""
    rest, options = [], {}
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        if key in _SUBCOMMAND_OPTIONS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            options[key] = value
        else:
            rest.append(args[i])
        i += 1
    return rest, options


def _check_config_files(args: list[str], configs_dir: Path) -> None:
    shipped = sorted(p.stem for p in configs_dir.glob("*.y*ml"))
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(("--config=", "-c=")):
            value = arg.split("=", 1)[1]
        else:
            continue
        if not Path(value).is_file():
            raise RecipeArgumentError(
                f"config {value!r} is neither a file nor a shipped config{nearest(Path(value).stem, shipped)}; "
                f"valid configs: {', '.join(shipped)} (or the path of a YAML file)"
            )


_LINK_FAILED = re.compile(r"^Call to compute_fn of link '[^']*' with args .*?\) failed: ", re.DOTALL)


def condense_error(message: str) -> str:
    """jsonargparse's multi-line union error -> ``key: reason`` on one line (the class's own message kept)."""
    # An error of the DataModule raised while the CLI computes a linked value (``dense_width_of(data)``
    # reads the Parquet schema: a missing column, no files): the class's message, without jsonargparse's
    # "Call to compute_fn of link ... with args ({Train dataloader: None}; ...) failed:" around it.
    message = _LINK_FAILED.sub("", message, count=1)
    key = re.search(r'Parser key "([^"]+)"', message)
    # A value a class's parser refused (``--data.id_mapping managd`` under ``--data parquet``): jsonargparse
    # names the outer key ("data") and, nested under "Problem with given class_path", the class's own key.
    nested = re.search(r'Problem with given class_path [^\n]*\n\s*Parser key "([^"]+)"', message)
    given = re.search(r"^\s*Given value: (.+)$", message, re.MULTILINE)
    reasons = []
    for line in message.splitlines():
        text = line.strip().removeprefix("- ").strip()
        if not text or text.startswith(
            ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value")
        ):
            continue
        if text.startswith(("Expected a <class 'NoneType'>", "Problem with given class_path")):
            continue
        reasons.append(text)
    reason = "; ".join(dict.fromkeys(reasons)) or message.strip().splitlines()[0]
    value = given.group(1).strip() if given else ""
    if value and "Got value" not in reason and value not in reason and not value.startswith("Namespace("):
        reason += f", got {value!r}"  # "Expected a <class 'int'>" alone hid what was typed
    name = f"{key.group(1)}.{nested.group(1)}" if key and nested else key.group(1) if key else ""
    return f"--{name}: {reason}" if name else reason


def _known_keys(parser: object, data_class: type | None) -> list[str]:
    keys = [k for k in getattr(parser, "_option_string_actions", {}) if k.startswith("--")]
    if data_class is not None:
        params = [p for p in inspect.signature(data_class).parameters if p not in ("self", "args", "kwargs")]
        keys += [f"--data.init_args.{p}" for p in params] + [f"--data.{p}" for p in params]
    return keys


def _unknown_key_hint(message: str, user_args: list[str], known: list[str]) -> str:
    """``--bad.key is not an option; did you mean --good.key?`` for a key of the error, else ``""``."""
    for arg in user_args:
        key = arg.partition("=")[0]
        if not key.startswith("--") or key in known:
            continue
        last = key.rsplit(".", 1)[-1]
        if key in message or f"'{last}'" in message:
            return f"{key} is not an option{nearest(key, known)}"
    return ""


def _data_class_path(args: list[str]) -> str | None:
    """The DataModule class the command line picks (``--data parquet`` resolved, ``--data.class_path X``),
    the last one given; ``None`` when it picks none (the config's then)."""
    found = None
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in ("--data", "--data.class_path"):
            value = value if eq else args[i + 1] if i + 1 < len(args) else ""
            found = value if value and not value.startswith(("-", "{")) else found
    return found


def _data_class(config: Any, args: Sequence[str] = ()) -> type | None:
    data = config.get("data") if hasattr(config, "get") else None
    class_path = _data_class_path(list(args)) or getattr(data, "class_path", None) or (
        data.get("class_path") if isinstance(data, dict) else None
    )
    if not isinstance(class_path, str):
        return None
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None


class _CheckCLI(LightningCLI):
    """Parses and builds model and DataModule, raising instead of exiting; builds no Trainer.

    Its parser has no subcommands, so the ``fit`` options a saved run's ``config.yaml`` holds
    (``ckpt_path: null``, ``weights_only: null``) are declared here: passing that file back with
    ``-c`` must not fail the check (the fit subcommand reads them; ``--ckpt_path`` typed on the
    command line is checked on its own).
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--ckpt_path", type=str | None, default=None)
        parser.add_argument("--weights_only", type=bool | None, default=None)
        parser.add_argument("--verbose", type=bool | None, default=None)
        parser.add_argument("--return_predictions", type=bool | None, default=None)

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        return None


def _build(cli_class: type[LightningCLI], model_class: type, args: list[str]) -> LightningCLI:
    class Check(_CheckCLI, cli_class):  # type: ignore[misc, valid-type]
        pass

    return Check(
        model_class,
        pl.LightningDataModule,
        subclass_mode_data=True,
        seed_everything_default=0,
        run=False,
        args=args,
        parser_kwargs={"exit_on_error": False},
    )


def _config_only(args: list[str]) -> list[str]:
    out = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            out += [arg, args[i + 1]]
        elif arg.startswith(("--config=", "-c=")):
            out.append(arg)
    return out


def check_recipe_args(
    cli_class: type[LightningCLI], model_class: type, args: list[str], configs_dir: Path
) -> RequestedDevices | None:
    """Check a recipe's resolved arguments (``[subcommand, --config, FILE, ...]``) before any rank starts.

    Returns:
        What will run (``None`` for ``--help`` / ``--print_config``, which are not checked).

    Raises:
        RecipeArgumentError: a problem, in one line (see the module docstring).
    """
    if any(a in ("-h", "--help") or a.startswith("--print_config") for a in args):
        return None
    body, options = _split_subcommand_options(args[1:] if args and not args[0].startswith("-") else args)
    ckpt = options.get("--ckpt_path")
    if ckpt and ckpt not in ("last", "best", "hpc", "registry") and not Path(ckpt).exists():
        raise RecipeArgumentError(
            f"--ckpt_path {ckpt!r} does not exist; give the path of a .ckpt file or sharded checkpoint folder "
            "(e.g. lightning_logs/<name>/version_0/checkpoints/last.ckpt)"
        )
    _check_config_files(body, configs_dir)
    try:
        with _quiet():
            cli = _build(cli_class, model_class, body)
    except Exception as exc:  # the parser's and the classes' own errors, named and condensed
        message = condense_error(str(exc))
        hint = ""
        try:
            with _quiet():
                base = _build(cli_class, model_class, _config_only(body))
            hint = _unknown_key_hint(str(exc), body, _known_keys(base.parser, _data_class(base.config, body)))
        except Exception:  # the config alone fails: the message above says why
            pass
        raise RecipeArgumentError(hint or message) from exc
    if isinstance(cli.datamodule, CheckedData):
        try:
            cli.datamodule.check_data()
        except FileNotFoundError as exc:
            raise RecipeArgumentError(str(exc)) from exc
    notes = check_built_run(cli, body, ckpt, RecipeArgumentError)  # accelerator, data kind, batches per rank, resume
    trainer = cli.config.get("trainer", {})
    return RequestedDevices(trainer.get("devices", "auto"), str(trainer.get("accelerator", "auto")), tuple(notes))


def warn_if_devices_exceed_cores(requested: RequestedDevices) -> str | None:
    """A warning line when more CPU processes than cores are asked for (each rank then waits its turn)."""
    cores = os.cpu_count() or 1
    devices = requested.devices
    count = (
        int(devices) if isinstance(devices, int) or (isinstance(devices, str) and devices.isdigit()) else 0
    )
    on_cpu = requested.accelerator == "cpu" or (requested.accelerator == "auto" and not _has_gpu())
    if on_cpu and count > cores:
        return (
            f"warning: --devices {count} starts {count} CPU processes on a machine with {cores} cores; they will take "
            f"turns and run slower than --devices {cores}"
        )
    return None


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def print_warning(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr, flush=True)
