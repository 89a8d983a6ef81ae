"""The recipes: runnable LightningCLI scripts and their YAML configs (installed as ``lightrec.recipes``).

This folder sits at the top of the checkout; a wheel installs it as the package ``lightrec.recipes``
(``package-dir`` in ``pyproject.toml``), and a checkout imported without installing finds it under
that name too (``lightrec/_source_tree.py``), so ``lightrec run|ls|cp|plan`` work either way::

    recipes/dlrm.py          DLRMModule: DLRM / DLRM-DCNv2 (synthetic data or Criteo)
    recipes/two_tower.py     TwoTowerModule: retrieval on MovieLens, recall@k
    recipes/deepfm.py        DeepFMModule: CTR on MovieLens
    recipes/configs/*.yaml   one config per (recipe, data) pair; the header gives the commands

A recipe is one ``RecModule`` subclass and a ``main`` that calls ``run_recipe``; it imports public
lightrec modules only (``lightrec.lightning.recipe``, ``lightrec.models`` ...), so it runs as ``lightrec run NAME``, ``python recipes/NAME.py``, under
``torchrun`` and ``fabric run``, and a ``lightrec cp`` copy runs anywhere. ``RECIPES`` maps each name
``lightrec run`` accepts to its script and default config; ``CONFIGS`` maps every config to the
script that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CONFIGS",
    "CONFIGS_DIR",
    "RECIPES",
    "RECIPES_DIR",
    "Recipe",
    "UnknownRecipeError",
    "config_path",
    "config_summary",
    "configs_of",
    "get_recipe",
]

RECIPES_DIR = Path(__file__).resolve().parent
CONFIGS_DIR = RECIPES_DIR / "configs"


@dataclass(frozen=True)
class Recipe:
    """A runnable recipe: ``script`` (module ``lightrec.recipes.<script>``) with its ``default_config``."""

    name: str
    script: str
    default_config: str
    description: str

    @property
    def module(self) -> str:
        return f"lightrec.recipes.{self.script}"

    @property
    def path(self) -> Path:
        return RECIPES_DIR / f"{self.script}.py"


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("dlrm", "dlrm", "dlrm", "DLRM on synthetic Criteo-like data, 2 CPU ranks (the main job)"),
        Recipe("dlrm_dcn", "dlrm", "dlrm_dcn", "DLRM-DCNv2 on synthetic Criteo-like data"),
        Recipe("dlrm_online", "dlrm", "dlrm_online", "DLRM trained online on a drifting stream, progressive validation"),
        Recipe("two_tower", "two_tower", "two_tower_movielens", "two-tower retrieval on MovieLens, recall@k"),
        Recipe("deepfm", "deepfm", "deepfm_movielens", "DeepFM click prediction on MovieLens"),
    )
}

CONFIGS: dict[str, str] = {
    "dlrm": "dlrm",
    "dlrm_dcn": "dlrm",
    "dlrm_criteo": "dlrm",
    "dlrm_dcn_criteo": "dlrm",
    "dlrm_managed": "dlrm",
    "dlrm_parquet": "dlrm",
    "dlrm_online": "dlrm",
    "two_tower_movielens": "two_tower",
    "deepfm_movielens": "deepfm",
}
"""Config name (file ``configs/<name>.yaml``) -> the script that runs it."""


class UnknownRecipeError(KeyError):
    """A recipe or config name that is not shipped; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        UnknownRecipeError: ``name`` is not a recipe (lists the valid names).
    """
    if name not in RECIPES:
        raise UnknownRecipeError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    return RECIPES[name]


def config_path(name: str) -> Path:
    """File of the shipped config ``name`` (with or without ``.yaml``).

    Raises:
        UnknownRecipeError: no such config (lists the valid names).
    """
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem not in CONFIGS:
        raise UnknownRecipeError(f"unknown config {name!r}; valid configs: {', '.join(CONFIGS)}")
    return CONFIGS_DIR / f"{stem}.yaml"


def configs_of(script: str) -> list[str]:
    """Names of the configs run by ``script``."""
    return [c for c, s in CONFIGS.items() if s == script]


def config_summary(name: str) -> str:
    """First line of the config's header comment."""
    for line in config_path(name).read_text().splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("# ").strip()
    return ""
