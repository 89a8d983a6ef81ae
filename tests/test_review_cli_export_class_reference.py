"""``lightrec export`` finds the RecModule class a checkpoint or ``--module`` names: a module next to the
user's script (the console script's ``sys.path`` lacks the current folder), a class nested in a class, and
a recipe file run by ``lightrec run path/to/recipe.py`` (recorded by its file, not by an unimportable name)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from lightrec.cli.export import load_class
from lightrec.lightning.class_reference import class_reference

MODELS = """
from lightrec.recipes.dlrm import DLRMModule


class MyRec(DLRMModule):
    pass


class Outer:
    class Inner(DLRMModule):
        pass
"""


@pytest.fixture
def in_folder_off_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder holds ``mymodels.py`` and, as for the ``lightrec`` console script, is not on sys.path."""
    (tmp_path / "mymodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    kept = [p for p in sys.path if p not in ("", os.curdir) and os.path.abspath(p) != str(tmp_path)]
    monkeypatch.setattr(sys, "path", kept)
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    return tmp_path


def test_a_dotted_class_in_the_current_folder_is_found(in_folder_off_sys_path: Path) -> None:
    cls = load_class("mymodels.MyRec")
    assert cls.__name__ == "MyRec" and Path(sys.modules["mymodels"].__file__ or "").parent == in_folder_off_sys_path
    assert str(in_folder_off_sys_path) not in sys.path  # the folder was on the path only for the import


@pytest.mark.parametrize("given", ["dotted", "file"])
def test_a_class_nested_in_a_class_is_found(in_folder_off_sys_path: Path, given: str) -> None:
    reference = "mymodels.Outer.Inner" if given == "dotted" else f"{in_folder_off_sys_path / 'mymodels.py'}:Outer.Inner"
    assert load_class(reference).__qualname__ == "Outer.Inner"


def test_a_missing_nested_attribute_is_named(in_folder_off_sys_path: Path) -> None:
    from lightrec.cli.common import UsageError

    with pytest.raises(UsageError, match="names nothing: mymodels.Outer has no attribute 'Missing'"):
        load_class("mymodels.Outer.Missing")
    with pytest.raises(UsageError, match=r"cannot be imported \(ModuleNotFoundError: No module named 'nomodule'\)"):
        load_class("nomodule.sub.Class")


def test_a_class_of_a_recipe_file_off_sys_path_is_named_by_its_file(tmp_path: Path) -> None:
    """``lightrec run my/dlrm.py`` imports the file as module ``dlrm``: ``dlrm.DLRMModule`` imports nowhere."""
    folder = tmp_path / "my"
    folder.mkdir()
    (folder / "dlrm.py").write_text(MODELS)
    spec = importlib.util.spec_from_file_location("dlrm_review_recipe", folder / "dlrm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlrm_review_recipe"] = module
    try:
        spec.loader.exec_module(module)
        reference = class_reference(module.MyRec)
    finally:
        del sys.modules["dlrm_review_recipe"]
    assert reference == f"{folder / 'dlrm.py'}:MyRec"
    assert load_class(reference).__name__ == "MyRec"  # what the export's message tells the user to pass


def test_a_class_of_an_importable_module_keeps_its_dotted_name() -> None:
    from lightrec.recipes.dlrm import DLRMModule

    assert class_reference(DLRMModule) == "lightrec.recipes.dlrm.DLRMModule"
    assert load_class(class_reference(DLRMModule)) is DLRMModule
