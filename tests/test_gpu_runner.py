""".ci/gpu, the runner of the GPU suite on a machine without internet (docs/gpu.md): its wheel list
covers what lightrec and its tests import beyond torch, and it tells which wheels a Python lacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / ".ci" / "gpu"


def _entries() -> dict[str, str]:
    """``{module: "dist==version"}`` of .ci/gpu-wheels.txt."""
    out = {}
    for line in (REPO / ".ci" / "gpu-wheels.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin, _, module = line.partition("#")
            out[module.strip()] = pin.strip()
    return out


def test_the_wheel_list_covers_the_imports_beyond_torch() -> None:
    entries = _entries()
    needed = {"lightning", "lightning_utilities", "torchmetrics", "jsonargparse", "docstring_parser",
              "typeshed_client", "yaml", "numpy", "typing_extensions", "pytest", "hypothesis"}  # fmt: skip
    assert needed <= set(entries), needed - set(entries)
    assert all(("==" in pin or ">=" in pin) for pin in entries.values()), entries
    # the TensorBoard logger of the recipes needs tensorboard or, pure Python, tensorboardX
    assert "tensorboardX" in entries


def test_missing_lists_only_wheels_this_python_lacks() -> None:
    done = subprocess.run(
        ["bash", str(RUNNER), "missing"], env={**os.environ, "PYTHON": sys.executable, "SITE": "/nonexistent"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lacking = done.stdout.split()
    assert set(lacking) <= set(_entries().values()), lacking
    import importlib.util

    for module, pin in _entries().items():
        assert (pin in lacking) == (importlib.util.find_spec(module) is None), module


def test_usage_without_a_command() -> None:
    done = subprocess.run(["bash", str(RUNNER)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and ".ci/gpu fetch" in done.stdout and ".ci/gpu test" in done.stdout
