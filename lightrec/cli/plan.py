"""``lightrec plan <config>``: the sharding plan of a recipe config, without training.

The model is built on the ``meta`` device from the config (no Trainer, no data loading beyond what
sizes the tables) and planned for the config's -- or the given -- devices x nodes; the report is
printed as text or markdown, the per-rank chart written with ``--png``, the plan with ``--json``
(a file ``RecStrategy(plan=...)`` accepts; its module paths are the ``RecModule``'s).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

import torch

from lightrec.cli.common import (
    CommandError,
    UsageError,
    command_parser,
    output_argument,
    positive_int,
    shipped_recipe,
)
from lightrec.distributed.planner import PlannerError, plan_sharding, topology_for  # no Lightning
from lightrec.recipes import CONFIGS, CONFIGS_DIR, RECIPES

__all__ = ["register", "run"]

OVERRIDE_PREFIXES = ("--model.", "--data.", "--trainer.")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(sub, "plan", "print the sharding plan of a config without training")
    parser.add_argument("config", help="a shipped config or recipe name, or a YAML file")
    parser.add_argument("--recipe", help="the recipe of a YAML file that is not a shipped config")
    parser.add_argument("--devices", type=positive_int, help="ranks per node (default: the config's)")
    parser.add_argument("--num-nodes", dest="num_nodes", type=positive_int, help="nodes (default: the config's)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu", "cuda"], help="default: the config's")
    parser.add_argument("--markdown", action="store_true", help="print the report as a markdown table")
    parser.add_argument("--png", metavar="PATH", help="also write the per-rank memory/cost chart there")
    parser.add_argument("--json", metavar="PATH", help="also write the plan as JSON (RecStrategy(plan=PATH))")
    parser.epilog = (
        "Config overrides such as --model.embedding_dim=64 or --data.init_args.batch_size=4096 also work."
    )
    return parser


def script_for_config(config: str, recipe: str | None, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """``(script, config file)`` for a shipped config name, a recipe name or a YAML path."""
    script = shipped_recipe(recipe, parser).script if recipe is not None else None
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
        return (script or CONFIGS[stem]), path
    if script is not None:
        return script, config
    if stem in CONFIGS:
        return CONFIGS[stem], config
    parser.error(
        f"cannot tell which recipe config {config!r} is for; pass --recipe with one of: {', '.join(RECIPES)}"
    )
    raise AssertionError  # parser.error exits


def count_devices(devices: int | str | list[int] | tuple[int, ...], accelerator: str) -> int:
    """Processes per node that a Trainer's ``devices`` value means."""
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


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    bad = [a for a in rest if a.startswith("-") and not a.startswith(OVERRIDE_PREFIXES)]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (plan takes {', '.join(OVERRIDE_PREFIXES)}* overrides)")
    script, config = script_for_config(ns.config, ns.recipe, parser)
    for out, example in ((ns.png, "plan.png"), (ns.json, "plan.json")):
        if out is not None:  # before the model is built and planned, not after (plan overwrites: force)
            output_argument(Path(out), force=True, example=example)
    module = importlib.import_module(f"lightrec.recipes.{script}")
    from lightrec.distributed.dmp.default_sharders import get_default_sharders
    from lightrec.lightning.contracts import planning_batch_size
    from lightrec.lightning.rec_module import RecModule
    from lightrec.lightning.recipe.checks import condense_error  # Lightning: only when a plan is asked for
    from lightrec.lightning.recipe.cli import plan_cli
    from lightrec.lightning.recipe.module import RecipeModule

    try:
        cli = plan_cli(module, config, rest)
        rec_module, datamodule = cli.model, cli.datamodule
        if isinstance(rec_module, RecipeModule) and not rec_module.tables:
            # What Trainer.fit does before configure_model: prepare the data, then size the tables.
            datamodule.prepare_data()
            datamodule.setup("fit")
            rec_module.size_tables_from(datamodule)
    except (ValueError, TypeError, OSError) as exc:  # a bad value or missing data: the user's to fix
        raise UsageError(f"cannot build the model of {config}: {condense_error(str(exc))}") from exc
    trainer_cfg = cli.config["trainer"]
    accelerator = str(ns.accelerator or trainer_cfg.get("accelerator") or "cpu")
    devices = count_devices(ns.devices if ns.devices is not None else trainer_cfg.get("devices", 1), accelerator)
    num_nodes = int(ns.num_nodes if ns.num_nodes is not None else trainer_cfg.get("num_nodes", 1) or 1)

    # Plan the RecModule itself (its model built with meta tables): the plan's module paths are
    # then the ones RecStrategy sees (model.sparse_arch...), so --json output is directly usable.
    if not isinstance(rec_module, RecModule):
        raise UsageError(f"lightrec plan plans RecModule recipes; {config} builds a {type(rec_module).__name__}")
    rec_module.model = rec_module.model_for_planning()
    sharders = get_default_sharders(rec_module.fused_params())
    topology = topology_for(devices * num_nodes, "cuda" if accelerator in ("gpu", "cuda") else "cpu", devices)
    batch_size = planning_batch_size(datamodule)
    try:
        constraints = rec_module.planner_constraints()  # tables_on="ssd": their kernel
        planned = plan_sharding(rec_module, sharders, topology, constraints or None, batch_size=batch_size)
    except PlannerError as exc:
        raise CommandError(f"no sharding plan fits: {exc}") from exc
    plan, report = planned.plan, planned.report
    print(f"plan for {config} ({script}.py): {devices} device(s) x {num_nodes} node(s), {topology.compute_device}")
    if report is None:
        print("the model has no embedding tables to shard")
        return 0
    print(report.to_markdown() if ns.markdown else report.to_text())
    if ns.png:
        from lightrec.distributed.planner.report import plan_chart  # matplotlib, only when asked

        _write(ns.png, lambda: plan_chart(report, ns.png))
    if ns.json:
        _write(ns.json, lambda: plan.save(ns.json))  # atomic: a reader never sees half a plan
    return 0


def _write(path: str, write: Callable[[], object]) -> None:
    """Run ``write``; a failure the up-front check cannot foresee (permissions, a full disk) is one line."""
    try:
        write()
    except OSError as exc:
        raise CommandError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    print(f"wrote {path}")
