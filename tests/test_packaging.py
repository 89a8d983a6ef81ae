"""The layout installs as one package: pyproject lists every package, the recipes (top-level
``recipes/``) install as ``lightrec.recipes``, and ``lightrec ls|cp`` work from a built wheel as from
the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_pyproject_lists_every_package() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lightrec").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == folders | {"lightrec.recipes"}, (
        "[tool.setuptools] packages in pyproject.toml must name every package folder of lightrec/"
    )
    assert setuptools["package-dir"] == {"lightrec.recipes": "recipes"}
    assert (ROOT / "recipes" / "__init__.py").is_file()
    assert not (ROOT / "lightrec" / "recipes").exists(), "the recipes live in the top-level recipes/ folder"


def _run(args: list[str], cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_checkout_imports_the_top_level_recipes_as_lightrec_recipes(tmp_path: Path) -> None:
    """Without installing (PYTHONPATH=<checkout>), from another folder: the checkout's recipes, not
    those of another lightrec that an editable install may map the name to."""
    out = _run(
        [sys.executable, "-c", "import lightrec.recipes.dlrm as d; print(d.__file__)"], tmp_path, ROOT
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == ROOT / "recipes" / "dlrm.py"


def test_a_recipe_runs_as_a_script_file(tmp_path: Path) -> None:
    """`python recipes/dlrm.py --help` from the checkout: the recipe imports public lightrec modules only."""
    out = _run([sys.executable, str(ROOT / "recipes" / "dlrm.py"), "fit", "--help"], tmp_path, ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--model.embedding_dim" in out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools")
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the checkout")
    build = tmp_path_factory.mktemp("wheel")
    source = build / "src"
    # A copy of the tracked tree (no build/ or egg-info left in the checkout).
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "-w", str(build / "dist"), "--no-deps",
         "--no-build-isolation", "-q"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"pip wheel cannot build here: {out.stderr[-500:]}")
    (found,) = (build / "dist").glob("lightrec-*.whl")
    return found


def test_the_wheel_holds_the_recipes_as_lightrec_recipes(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for recipe in ("dlrm", "two_tower", "deepfm"):
        assert f"lightrec/recipes/{recipe}.py" in names
    assert {f"lightrec/recipes/configs/{p.name}" for p in (ROOT / "recipes" / "configs").glob("*.yaml")} <= names
    assert "lightrec/cli/__main__.py" in names
    assert not any(n.startswith(("recipes/", "tests/")) for n in names)
    # The native CPU ops are compiled from these at first use (lightrec/_native.py).
    sources = {f"lightrec/csrc/{p.name}" for p in (ROOT / "lightrec" / "csrc").glob("*.cpp")}
    assert sources and sources <= names


def test_ls_and_cp_work_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ls = _run([sys.executable, "-m", "lightrec.cli", "ls"], tmp_path, site)
    assert ls.returncode == 0, ls.stderr
    assert "dlrm" in ls.stdout and str(site / "lightrec" / "recipes" / "configs") in ls.stdout
    cp = _run([sys.executable, "-m", "lightrec.cli", "cp", "dlrm", "mine"], tmp_path, site)
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "mine" / "dlrm.py").read_text() == (ROOT / "recipes" / "dlrm.py").read_text()
    assert (tmp_path / "mine" / "configs" / "dlrm.yaml").is_file()
