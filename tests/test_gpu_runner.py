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


def test_gpu_test_also_runs_the_triton_kernel_tests_compiled(tmp_path: Path) -> None:
    """``.ci/gpu test`` runs ``-m gpu`` and then the Triton kernels' own (unmarked) test files with
    ``TRITON_INTERPRET`` unset, so the compiled kernels are compared with the torch backend on the
    GPU. A stand-in Python logs each pytest call; the exit status is the worst of the two runs."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then\n'
        f'  echo "TRITON_INTERPRET=${{TRITON_INTERPRET:-unset}} $*" >> {log}\n'
        '  case "$*" in *"-m gpu"*) exit 3;; esac\n'
        "fi\n"
        "exit 0\n"
    )
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(RUNNER), "test", "-x"],
        env={**os.environ, "PYTHON": str(fake), "SITE": str(tmp_path / "site"), "TRITON_INTERPRET": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the -m gpu run failed: so does the command
    gpu_run, triton_run = log.read_text().splitlines()
    assert "-m pytest -m gpu" in gpu_run and gpu_run.endswith("-x")
    assert triton_run.startswith("TRITON_INTERPRET=unset -m pytest -m not gpu")
    files = triton_run.split()
    for name in ("test_triton_backend.py", "test_triton_edge_cases.py", "test_triton_quant.py"):
        assert any(f.endswith(name) for f in files), name
