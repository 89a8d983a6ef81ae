"""Old import paths and old names keep working after the architecture step (lightrec._moved_modules)."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

from lightrec._moved_modules import MOVED
from lightrec._triton import triton_available


def _needs(old: str) -> None:
    if "triton_quant_kernel" in old and not triton_available():
        pytest.skip("the Triton kernel module imports triton")


@pytest.mark.parametrize("old", sorted(old for old, homes in MOVED.items() if len(homes) == 1))
def test_an_old_path_is_the_module_itself(old: str) -> None:
    _needs(old)
    (home,) = MOVED[old]
    module = importlib.import_module(old)
    assert module is importlib.import_module(home)
    assert module.__name__ == home and module.__spec__.name == home  # it still knows where it lives
    assert sys.modules[old] is module


@pytest.mark.parametrize("old", sorted(old for old, homes in MOVED.items() if len(homes) > 1))
def test_an_old_path_split_over_modules_exports_every_home(old: str) -> None:
    module = importlib.import_module(old)
    for home in MOVED[old]:
        new = importlib.import_module(home)
        for name in new.__all__:
            assert getattr(module, name) is getattr(new, name), (old, name)


def test_old_spellings_in_user_code() -> None:
    from lightrec.inference.quant_rows import max_abs_error  # a name outside __all__
    from lightrec.inference.sharded import export_on_rank, unshard

    from lightrec.quant.row_codec import max_abs_error as new_max_abs_error

    assert max_abs_error is new_max_abs_error
    assert export_on_rank is importlib.import_module("lightrec.inference.export").export_on_rank
    assert unshard is importlib.import_module("lightrec.inference.gather").unshard
    import lightrec.inference.table_groups

    import lightrec.quant.table_groups

    assert lightrec.inference.table_groups is lightrec.quant.table_groups
    # pickles that name the old path load
    blob = b"clightrec.inference.quant_rows\ndequantize_rows\n."
    assert pickle.loads(blob) is importlib.import_module("lightrec.quant.row_codec").dequantize_rows


def test_old_paths_work_in_a_fresh_interpreter() -> None:
    """Without anything imported first: the finder comes with ``import lightrec`` (any submodule)."""
    code = (
        "from lightrec.inference.kernels import pooled_lookup_torch\n"
        "from lightrec.data.sharding import RankBatchSampler\n"
        "import lightrec.quant.pooled_kernels as new\n"
        "assert pooled_lookup_torch is new.pooled_lookup_torch\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_paths_still_fail() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightrec.inference.no_such_module")


def test_renamed_classes_keep_their_old_names() -> None:
    from lightrec.recipes._common import TableSpec as OldRecipeTableSpec

    from lightrec.kernels import BatchedTableSpec, TableSpec
    from lightrec.lightning import RecThroughputMonitor, ThroughputMonitor
    from lightrec.quant.table_groups import StoredTableLayout
    from lightrec.quant.table_groups import TableSpec as OldStoredTableSpec
    from lightrec.recipes.table_specs import DataTableSpec

    assert TableSpec is BatchedTableSpec and ThroughputMonitor is RecThroughputMonitor
    assert OldStoredTableSpec is StoredTableLayout and OldRecipeTableSpec is DataTableSpec


def test_a_recipe_copied_before_still_builds_its_model() -> None:
    """The shape of a recipe ``lightrec cp`` wrote before: RecipeModule from ``_common``, ``_cli.run_recipe``."""
    from lightrec.recipes._cli import run_recipe
    from lightrec.recipes._common import RecipeModule

    from lightrec.kernels import FusedEmbeddingBagCollection

    class OldRecipe(RecipeModule):
        def build_model(self, embedding_bag_collection):  # noqa: ANN001, ANN202
            return embedding_bag_collection

    module = OldRecipe(tables=[{"name": "t", "num_embeddings": 5, "feature_names": ["f"]}], embedding_dim=4,
                       embedding_lr=0.2)  # fmt: skip
    assert isinstance(module.built_model(), FusedEmbeddingBagCollection)
    assert module.fused_params()["learning_rate"] == 0.2 and callable(run_recipe)
