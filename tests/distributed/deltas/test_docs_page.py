"""docs/deltas.md stays true: its blocks run and print what the page shows, and its reading example
runs where lightrec cannot be imported, rebuilding the same tables as ``DeltaReader``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from lightrec.distributed.deltas import DeltaReader, DeltaWriter
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows
from tests.docs.markdown_blocks import python_blocks, run_page

PAGE = Path(__file__).resolve().parents[3] / "docs" / "deltas.md"

# lightrec made unimportable before the example runs; then what it rebuilt is saved for comparison
_BLOCKER = "import sys\nsys.modules['lightrec'] = None\n"
_SAVE = """
from safetensors.torch import save_file
save_file({k: v.contiguous() for k, v in tables.items()}, 'tables.safetensors')
assert not any(m == 'lightrec' or m.startswith('lightrec.') for m in sys.modules if sys.modules[m] is not None)
"""


@pytest.mark.slow  # the page's training, publishing and fresh reader process: ~37 s on 2 shared cores
def test_page_blocks_run_and_print_what_the_page_shows(tmp_path: Path) -> None:
    result = run_page(PAGE, tmp_path, timeout=300, env={"OMP_NUM_THREADS": "1"})
    problems = result.problems(python_blocks(PAGE))
    assert not problems, "\n\n".join(problems)


def test_the_reading_example_needs_no_lightrec(tmp_path: Path) -> None:
    example = next(b.code for b in python_blocks(PAGE) if "lightrec" not in b.code)
    writer = DeltaWriter(tmp_path / "publish", SPECS)
    writer.write_snapshot(full_rows(0), dense(0))
    writer.write_delta(some_rows(1))
    writer.write_delta(some_rows(2, skip="a"))
    script = tmp_path / "example.py"
    script.write_text(_BLOCKER + example + _SAVE)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3 {")
    rebuilt = safetensors.torch.load_file(str(tmp_path / "tables.safetensors"))
    state = DeltaReader(tmp_path / "publish").state()
    assert rebuilt.keys() == state.rows.keys()
    assert all(torch.equal(rebuilt[name], state.rows[name].values) for name in rebuilt)
