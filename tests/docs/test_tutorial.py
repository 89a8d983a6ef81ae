"""docs/tutorial.md stays true: its python blocks run, in order, and print what the page shows.

The blocks run in one namespace in a fresh Python process (``tests/docs/markdown_blocks.py``), in
a temporary directory, so the page's process group, Lightning state and files never reach the
test process. A failure names the block number and its line in the page. The page's own
``MASTER_PORT`` default is replaced by a free port (the page uses ``os.environ.setdefault``), so
parallel runs do not collide.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import parse_blocks, python_blocks, run_page
from tests.multiprocess import free_port

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
# One intra-op thread, as in the rest of the suite (tests/conftest.py): the 2-core CI machine runs
# several test processes at once, and oversubscribed threads make the page many times slower.
ENV = {"MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


def test_every_printing_block_shows_its_output_and_fences_are_closed() -> None:
    blocks = parse_blocks(PAGE.read_text())
    code = [b for b in blocks if b.lang == "python"]
    assert len(code) >= 20, f"expected the whole tutorial, found {len(code)} python blocks"
    langs = {b.lang for b in blocks}
    assert langs <= {"python", "text", "bash"}, (
        f"unexpected fence languages {langs - {'python', 'text', 'bash'}}"
    )


@pytest.mark.slow  # the page's fits, one after the other: ~48 s on 2 shared cores
def test_tutorial_blocks_run_and_print_what_the_page_shows(tmp_path: Path) -> None:
    blocks = python_blocks(PAGE)
    started = time.perf_counter()
    result = run_page(PAGE, tmp_path, timeout=240, env=ENV | {"MASTER_PORT": str(free_port())})
    elapsed = time.perf_counter() - started
    problems = result.problems(blocks)
    assert not problems, "\n\n".join(problems)
    slowest = sorted(result.seconds.items(), key=lambda kv: -kv[1])[:3]
    # Reported, not asserted (no timed asserts): the page is meant to run in well under a minute.
    print(f"tutorial: {elapsed:.1f} s in all; slowest blocks (number, seconds): {slowest}")
    assert (tmp_path / "dlrm_int8.pt").exists() and (tmp_path / "dlrm_int8.pt.meta.json").exists()
