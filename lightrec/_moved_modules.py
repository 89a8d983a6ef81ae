"""Import paths of modules that moved, kept working: the old dotted path gives the module's new home.

``MOVED`` is the whole list. ``import lightrec.inference.quant_rows`` (an old path) returns the
module object ``lightrec.quant.row_codec`` itself -- not a copy -- so attributes, ``isinstance``
checks, ``monkeypatch`` and pickles that name the old path all see the real thing. New code
imports the new paths; the old ones are documented in ``CHANGELOG.md`` and stay until a release
says otherwise.

An entry whose new home is split over several modules (``lightrec.inference.sharded``,
``lightrec.inference.quant_embedding_modules``) gives a module object of its own that re-exports each home's ``__all__``; patch those names at their
home, not through the old path.

``install()`` (run by ``import lightrec``) appends a finder to ``sys.meta_path``; it answers
only for the names in ``MOVED`` and only after the regular finders found no file, so it never
shadows a real module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__all__ = ["MOVED", "install"]

MOVED: dict[str, tuple[str, ...]] = {
    # quantized tables and their kernels: lightrec.inference -> lightrec.quant (issue 14)
    "lightrec.inference.quant_embedding_modules": (
        "lightrec.quant.embedding_modules",
        "lightrec.quant.collection_base",
    ),
    "lightrec.inference.quant_embedding_collection": ("lightrec.quant.embedding_collection",),
    "lightrec.inference.quant_rows": ("lightrec.quant.row_codec",),
    "lightrec.inference.host_memory": ("lightrec.quant.host_memory",),
    "lightrec.inference.table_groups": ("lightrec.quant.table_groups",),
    "lightrec.inference.kernels": ("lightrec.quant.pooled_kernels",),
    "lightrec.inference.sequence_kernels": ("lightrec.quant.sequence_kernels",),
    "lightrec.inference.triton_lookup": ("lightrec.quant.triton_lookup",),
    "lightrec.inference.triton_quant_kernel": ("lightrec.quant.triton_quant_kernel",),
    "lightrec.inference.sharding": ("lightrec.quant.sharded_embedding_bag",),
    # the tracer: lightrec.inference.fx -> lightrec.fx
    "lightrec.inference.fx": ("lightrec.fx.tracer",),
    # gathering a sharded model (export_on_rank moved next to export)
    "lightrec.inference.sharded": ("lightrec.inference.gather", "lightrec.inference.export"),
    # names that say what they are
    "lightrec.data.sharding": ("lightrec.data.rank_sampling",),
    "lightrec.lightning.monitor": ("lightrec.lightning.rec_throughput_monitor",),
    # the recipes' shared code, now public
    "lightrec.recipes._cli": ("lightrec.recipes.recipe_cli",),
    "lightrec.recipes._common": ("lightrec.recipes.table_specs",),
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of ``MOVED`` and loads them as their new home (see the module docstring)."""

    def __init__(self) -> None:
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        homes = MOVED[spec.name]
        if len(homes) == 1:
            module = importlib.import_module(homes[0])
            # The import system writes the old path's spec onto the module it is given; keep the
            # real one so the module still knows where it lives (exec_module puts it back).
            self._real_specs[spec.name] = module.__spec__
            return module
        composite = types.ModuleType(
            spec.name, f"Old path of {', '.join(homes)} (see lightrec._moved_modules)."
        )
        names: list[str] = []
        for home in homes:
            module = importlib.import_module(home)
            for name in module.__all__:
                setattr(composite, name, getattr(module, name))
                names.append(name)
        composite.__all__ = names  # type: ignore[attr-defined]
        return composite

    def exec_module(self, module: types.ModuleType) -> None:
        real = self._real_specs.pop(module.__spec__.name if module.__spec__ else "", None)
        if real is not None:
            module.__spec__ = real


def install() -> None:
    """Make the old paths importable (idempotent)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
