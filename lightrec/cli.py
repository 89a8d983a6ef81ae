"""The ``lightrec`` console script: run, list, copy and plan recipes; export checkpoints.

::

    lightrec run dlrm                          # the main job: DLRM, synthetic data, 2 CPU ranks
    lightrec run dlrm --devices 1 --trainer.strategy auto --trainer.max_steps 50
    lightrec run two_tower --config two_tower_movielens --data.init_args.data_dir data/ml-1m
    lightrec ls                                # recipes and configs
    lightrec cp dlrm my_dlrm                   # my_dlrm/dlrm.py + my_dlrm/configs/*.yaml to edit
    lightrec plan dlrm --devices 8 --num-nodes 2 --markdown
    lightrec export lightning_logs/dlrm/version_0/checkpoints/last.ckpt
    lightrec consolidate lightning_logs/dlrm/version_0/checkpoints/last.ckpt full.ckpt

``run`` hands every argument it does not know to the recipe's LightningCLI (``fit`` is the
default subcommand), so ``--trainer.*``/``--model.*``/``--data.*`` work as in the recipe itself.
With ``devices > 1`` Lightning launches the other ranks by re-running this same command line.
Usage errors exit with code 2 and a line naming the valid choices; failures of a command with 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lightrec.distributed.checkpoint import (
    CheckpointError,
    ForeignCheckpointError,
    consolidate_checkpoint,
    is_sharded_checkpoint,
    load_file,
)
from lightrec.distributed.planner import PlannerError
from lightrec.distributed.planning import get_default_sharders, plan_sharding, topology_for
from lightrec.inference import export_from_checkpoint
from lightrec.recipes import CONFIGS, CONFIGS_DIR, RECIPES, config_summary, configs_of, get_recipe
from lightrec.recipes.run_checks import condense_error, nearest

if TYPE_CHECKING:  # annotation only: importing Lightning would slow every command down by a second
    from lightrec.lightning import RecModule

__all__ = ["main"]

USAGE_ERROR = 2
FAILURE = 1


class CommandError(Exception):
    """A command could not do its job (exit code 1, message printed without a traceback)."""


class UsageError(CommandError):
    """The user asked for something that cannot work: a path that is not a checkpoint, an output that
    exists (exit code 2, like an argument error, message printed without a traceback)."""


# ---------------------------------------------------------------------------------------------- run
def _run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    recipe = _recipe_or_usage_error(ns.recipe, parser, files=True)
    args = list(rest)
    subcommand = args.pop(0) if args and args[0] in ("fit", "validate", "test", "predict") else "fit"
    overrides = []
    for flag, value in (
        ("devices", ns.devices),
        ("accelerator", ns.accelerator),
        ("num_nodes", ns.num_nodes),
    ):
        if value is not None:
            overrides += [f"--trainer.{flag}", str(value)]
    config, args = _config_args(args)
    if isinstance(recipe, Path):  # a recipe file: its main() picks its own default config
        module = _import_file(recipe)
    else:
        module = importlib.import_module(recipe.module)
        config = config or ["--config", recipe.default_config]
    # Options given after the recipe name win over the shortcuts, which win over the config(s).
    try:
        module.main([subcommand, *config, *overrides, *args])
    except SystemExit as exc:  # the recipe's own usage errors (printed already) and exits
        return exc.code if isinstance(exc.code, int) else FAILURE
    return 0


def _config_args(args: list[str]) -> tuple[list[str], list[str]]:
    """``(the --config / -c arguments, the others)``: configs go first, so options override them."""
    config: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in ("--config", "-c") and i + 1 < len(args):
            config += args[i : i + 2]
            i += 2
            continue
        (config if args[i].startswith(("--config=", "-c=")) else rest).append(args[i])
        i += 1
    return config, rest


def _import_file(path: Path) -> Any:
    """Import a recipe file (``lightrec cp`` copies import lightrec's public modules only)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise CommandError(f"cannot import the recipe file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise CommandError(f"{str(path)!r} has no main(args) function; a recipe calls run_recipe(...) in main")
    return module


def _recipe_or_usage_error(name: str, parser: argparse.ArgumentParser, files: bool = False) -> Any:
    """The recipe called ``name`` (or, with ``files``, a recipe ``.py`` file); else a usage error."""
    if files and name.endswith(".py"):
        if not Path(name).is_file():
            parser.error(f"recipe file {name!r} does not exist")
        return Path(name)
    if name not in RECIPES:
        parser.error(
            f"unknown recipe {name!r}{nearest(name, list(RECIPES))}; valid recipes: {', '.join(RECIPES)}"
            + (" or a recipe .py file" if files else "")
        )
    return get_recipe(name)


# ----------------------------------------------------------------------------------------------- ls
def _ls(ns: argparse.Namespace) -> int:
    print("recipes (lightrec run <recipe>):")
    width = max(map(len, RECIPES))
    for r in RECIPES.values():
        print(f"  {r.name:<{width}}  {r.description}  [{r.script}.py, default config {r.default_config}]")
    print(f"\nconfigs (lightrec run <recipe> --config <config>; files in {CONFIGS_DIR}):")
    width = max(map(len, CONFIGS))
    for name, script in CONFIGS.items():
        print(f"  {name:<{width}}  ({script}.py)  {config_summary(name)}")
    return 0


# ----------------------------------------------------------------------------------------------- cp
def _cp(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    recipe = _recipe_or_usage_error(ns.recipe, parser)
    dest = Path(ns.dir)
    if dest.suffix in (".yaml", ".yml"):  # one config to edit, not a folder named x.yaml
        if dest.exists():
            raise UsageError(f"refusing to overwrite {str(dest)!r}; choose another name or remove it first")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CONFIGS_DIR / f"{recipe.default_config}.yaml", dest)
        print(f"wrote {dest} (the {recipe.name} recipe's default config)")
        print(f"\nedit, then run:  lightrec run {recipe.name} --config {dest}")
        return 0
    copies = [(recipe.path, dest / recipe.path.name)]
    copies += [(CONFIGS_DIR / f"{c}.yaml", dest / "configs" / f"{c}.yaml") for c in configs_of(recipe.script)]
    existing = [str(target) for _, target in copies if target.exists()]
    if existing:
        raise UsageError(
            f"refusing to overwrite {', '.join(existing)}; choose another directory or remove them first"
        )
    (dest / "configs").mkdir(parents=True, exist_ok=True)
    for source, target in copies:
        shutil.copyfile(source, target)
        print(f"wrote {target}")
    script = dest / recipe.path.name
    print(f"\nedit, then run:  python {script} fit --config {dest / 'configs' / recipe.default_config}.yaml")
    return 0


# --------------------------------------------------------------------------------------------- plan
def _script_for_config(config: str, recipe: str | None, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """``(script, config file)`` for a shipped config name, a recipe name or a YAML path."""
    if recipe is not None:
        script = _recipe_or_usage_error(recipe, parser).script
    if config in RECIPES and not Path(config).exists():
        config = RECIPES[config].default_config
    stem = Path(config).stem
    if not Path(config).exists():
        if config.removesuffix(".yaml") not in CONFIGS:
            parser.error(
                f"config {config!r} is neither a file nor a shipped config; valid configs: "
                f"{', '.join(CONFIGS)}; valid recipes: {', '.join(RECIPES)}"
            )
        path = str(CONFIGS_DIR / f"{config.removesuffix('.yaml')}.yaml")
        return (script if recipe is not None else CONFIGS[stem]), path
    if recipe is not None:
        return script, config
    if stem in CONFIGS:
        return CONFIGS[stem], config
    parser.error(
        f"cannot tell which recipe config {config!r} is for; pass --recipe with one of: {', '.join(RECIPES)}"
    )
    raise AssertionError  # parser.error exits


def _count_devices(devices: Any, accelerator: str) -> int:
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices.strip().isdigit() and int(devices) > 0:
        return int(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    # "auto" / -1: every visible GPU, or one CPU process.
    return max(torch.cuda.device_count(), 1) if accelerator in ("gpu", "cuda") else 1


def _plan(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    script, config = _script_for_config(ns.config, ns.recipe, parser)
    module = importlib.import_module(f"lightrec.recipes.{script}")
    from lightrec.recipes.recipe_cli import plan_cli

    try:
        cli = plan_cli(module, config, ns.overrides)
        rec_module, datamodule = cli.model, cli.datamodule
        size_tables_from = getattr(rec_module, "size_tables_from", None)
        if callable(size_tables_from) and not getattr(rec_module, "tables", None):
            # What Trainer.fit does before configure_model: prepare the data, then size the tables.
            datamodule.prepare_data()
            datamodule.setup("fit")
            size_tables_from(datamodule)
    except (ValueError, TypeError, OSError) as exc:  # a bad value or missing data: the user's to fix
        raise UsageError(f"cannot build the model of {config}: {condense_error(str(exc))}") from exc
    trainer_cfg = cli.config["trainer"]
    accelerator = str(ns.accelerator or trainer_cfg.get("accelerator") or "cpu")
    devices = _count_devices(
        ns.devices if ns.devices is not None else trainer_cfg.get("devices", 1), accelerator
    )
    num_nodes = int(ns.num_nodes if ns.num_nodes is not None else trainer_cfg.get("num_nodes", 1) or 1)

    # Plan the RecModule itself (its model built with meta tables): the plan's module paths are
    # then the ones RecStrategy sees (model.sparse_arch...), so --json output is directly usable.
    rec_module.model = rec_module.model_for_planning()
    sharders = get_default_sharders(rec_module.fused_params())
    topology = topology_for(devices * num_nodes, "cuda" if accelerator in ("gpu", "cuda") else "cpu", devices)
    batch_size = getattr(datamodule, "batch_size", None)
    try:
        planned = plan_sharding(
            rec_module,
            sharders,
            topology,
            batch_size=batch_size if isinstance(batch_size, int) and not isinstance(batch_size, bool) else None,
        )
    except PlannerError as exc:
        raise CommandError(f"no sharding plan fits: {exc}") from exc
    plan, report = planned.plan, planned.report
    print(
        f"plan for {config} ({script}.py): {devices} device(s) x {num_nodes} node(s), {topology.compute_device}"
    )
    if report is None:
        print("the model has no embedding tables to shard")
        return 0
    print(report.to_markdown() if ns.markdown else report.to_text())
    if ns.png:
        from lightrec.lightning.plan_chart import plan_chart  # matplotlib, only when asked

        plan_chart(report, ns.png)
        print(f"wrote {ns.png}")
    if ns.json:
        Path(ns.json).write_text(plan.to_json())
        print(f"wrote {ns.json}")
    return 0


# ------------------------------------------------------------------------------------------- export
def _load_class(reference: str) -> type[RecModule]:
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


def _checkpoint_argument(path: Path) -> None:
    """Refuse (``UsageError``) a checkpoint argument that is missing or a folder that is not a checkpoint."""
    if not path.exists():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir() and not is_sharded_checkpoint(path):
        raise UsageError(
            f"{str(path)!r} is a folder but not a lightrec sharded checkpoint (it holds no meta.pt and no "
            "manifest.json); pass the checkpoint folder itself, e.g. lightning_logs/<name>/version_0/checkpoints/"
            "last.ckpt"
        )


def _output_argument(out: Path, force: bool) -> None:
    """Refuse (``UsageError``) an output path that exists (without ``--force``), is a folder, or has no folder."""
    if out.is_dir():
        raise UsageError(f"{str(out)!r} is a folder; give the file to write, e.g. {str(out / 'full.ckpt')!r}")
    if out.exists() and not force:
        raise UsageError(f"{str(out)!r} exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"the folder of {str(out)!r} does not exist; create it first")


def _export(ns: argparse.Namespace) -> int:
    checkpoint = Path(ns.checkpoint)
    _checkpoint_argument(checkpoint)
    out = (
        Path(ns.out)
        if ns.out
        else checkpoint.parent / f"{checkpoint.stem}_{ns.dtype}.{'pt2' if ns.format == 'export' else 'pt'}"
    )
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
    rec_module = _load_class(reference).load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
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


def _consolidate(ns: argparse.Namespace) -> int:
    source, out = Path(ns.checkpoint), Path(ns.out)
    _checkpoint_argument(source)
    _output_argument(out, ns.force)
    try:
        consolidate_checkpoint(source, out)
    except ForeignCheckpointError as exc:  # a file, but not one lightrec wrote
        raise UsageError(str(exc)) from exc
    except CheckpointError as exc:  # damaged, or no room to write: names the file
        raise CommandError(str(exc)) from exc
    except OSError as exc:  # e.g. no permission to write there
        raise CommandError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    print(f"consolidated {source} -> {out} ({out.stat().st_size / 2**20:.1f} MiB of full tables)")
    return 0


# --------------------------------------------------------------------------------------------- main
_PLAN_OVERRIDES = ("--model.", "--data.", "--trainer.")


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``lightrec`` parser and its ``run`` subparser (whose help ``lightrec run --help`` prints)."""
    parser = argparse.ArgumentParser(
        prog="lightrec",
        description="Run, list, copy and plan lightrec recipes; export and consolidate checkpoints.",
        epilog="Start with `lightrec ls`, then `lightrec run dlrm`. `lightrec --version` names the versions in use.",
        allow_abbrev=False,
    )
    parser.add_argument("-V", "--version", action="store_true", help="print lightrec's and its dependencies' versions")
    sub = parser.add_subparsers(dest="command", metavar="{run,ls,cp,plan,export,consolidate}")
    sub.required = True

    run = sub.add_parser(
        "run",
        help="run a recipe (other arguments go to its LightningCLI; `fit` by default)",
        allow_abbrev=False,
        add_help=False,  # `lightrec run dlrm --help` shows the recipe's LightningCLI help
    )
    run.add_argument("recipe", help=f"one of: {', '.join(RECIPES)}")
    run.add_argument("--devices", type=_positive_int, help="processes per node (trainer.devices)")
    run.add_argument("--accelerator", choices=["cpu", "gpu", "cuda", "auto"], help="trainer.accelerator")
    run.add_argument("--num-nodes", dest="num_nodes", type=_positive_int, help="trainer.num_nodes")

    sub.add_parser("ls", help="list recipes and configs", allow_abbrev=False)

    cp = sub.add_parser(
        "cp", help="copy a recipe and its configs into a directory to edit", allow_abbrev=False
    )
    cp.add_argument("recipe", help=f"one of: {', '.join(RECIPES)}")
    cp.add_argument(
        "dir",
        help="destination directory, or a .yaml file for the recipe's default config alone "
        "(existing files are never overwritten)",
    )

    plan = sub.add_parser(
        "plan", help="print the sharding plan of a config without training", allow_abbrev=False
    )
    plan.add_argument("config", help="a shipped config or recipe name, or a YAML file")
    plan.add_argument("--recipe", help="the recipe of a YAML file that is not a shipped config")
    plan.add_argument("--devices", type=_positive_int, help="ranks per node (default: the config's)")
    plan.add_argument(
        "--num-nodes", dest="num_nodes", type=_positive_int, help="nodes (default: the config's)"
    )
    plan.add_argument("--accelerator", choices=["cpu", "gpu", "cuda"], help="default: the config's")
    plan.add_argument("--markdown", action="store_true", help="print the report as a markdown table")
    plan.add_argument("--png", metavar="PATH", help="also write the per-rank memory/cost chart there")
    plan.add_argument("--json", metavar="PATH", help="also write the plan as JSON (RecStrategy(plan=PATH))")

    export = sub.add_parser(
        "export", help="quantize a recipe checkpoint and write a serving artifact", allow_abbrev=False
    )
    export.add_argument("checkpoint", help="a .ckpt written by a recipe (a file, or a sharded checkpoint folder)")
    export.add_argument("--out", help="artifact path (default: next to the checkpoint)")
    export.add_argument("--dtype", choices=["int8", "int4", "fp16"], default="int8")
    export.add_argument("--format", choices=["torchscript", "export"], default="torchscript")
    export.add_argument(
        "--module", help="RecModule class (package.module.Class) if the checkpoint names none"
    )
    consolidate = sub.add_parser(
        "consolidate",
        help="gather a sharded checkpoint folder into one file of full tables",
        allow_abbrev=False,
    )
    consolidate.add_argument("checkpoint", help="a sharded checkpoint folder (RecStrategy / ModelCheckpoint)")
    consolidate.add_argument("out", help="the file to write")
    consolidate.add_argument("--force", action="store_true", help="replace OUT if it exists")
    plan.epilog = (
        "Config overrides such as --model.embedding_dim=64 or --data.init_args.batch_size=4096 also work."
    )
    return parser, run


def _version_line() -> str:
    """``lightrec X (torch Y, lightning Z, fbgemm_gpu W)``: what a bug report needs."""
    from importlib.metadata import PackageNotFoundError, version

    from lightrec._version import __version__

    parts = [f"torch {torch.__version__}"]
    for dist in ("lightning", "fbgemm-gpu-cpu", "fbgemm-gpu", "triton"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return f"lightrec {__version__} ({', '.join(parts)}; Python {sys.version.split()[0]})"


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lightrec`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, run_parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    if argv[0] in ("-V", "--version"):
        print(_version_line())
        return 0
    if argv == ["run"]:
        run_parser.error(f"the recipe is missing; valid recipes: {', '.join(RECIPES)}")
    if argv[:1] == ["run"] and argv[1] in ("-h", "--help"):
        run_parser.print_help()
        return 0
    ns, rest = parser.parse_known_args(argv)
    try:
        if ns.command == "run":
            return _run(ns, rest, parser)
        if ns.command == "plan":
            bad = [a for a in rest if a.startswith("-") and not a.startswith(_PLAN_OVERRIDES)]
            if bad:
                parser.error(
                    f"unrecognized arguments: {' '.join(bad)} (plan takes {', '.join(_PLAN_OVERRIDES)}* overrides)"
                )
            ns.overrides = rest
            return _plan(ns, parser)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if ns.command == "ls":
            return _ls(ns)
        if ns.command == "cp":
            return _cp(ns, parser)
        if ns.command == "consolidate":
            return _consolidate(ns)
        return _export(ns)
    except CommandError as exc:
        print(f"lightrec {ns.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR if isinstance(exc, UsageError) else FAILURE


if __name__ == "__main__":
    sys.exit(main())
