"""Extract the code blocks of a markdown page and run its ``python`` blocks in a fresh process.

Conventions the docs follow (and that these tests enforce)::

    ```python            run, in page order, all in one namespace (a later block sees earlier names)
    ```text              not run: printed output, illustrative code, or code that needs a GPU / cluster
    ```bash              not run here (tests/docs/test_howto_snippets.py checks the lightrec commands)

A ``text`` block that directly follows a ``python`` block (nothing but blank lines between them) is
that block's **expected output**: what the block prints must match it. Runs of whitespace count as
one space and blank lines are ignored; a line that is only ``...`` stands for any number of lines,
and ``...`` inside a line for any text on that line.
A ``python`` block that prints something must be followed by its output block, so the page never
hides what a reader will see.

The runner half of this file is stdlib only and is started as a script
(``python markdown_blocks.py PAGE REPORT``) in a new process, so that process groups,
Lightning's global state and files written by the page never leak into the test process. It
writes a JSON report after every block (a crash or a time-out still shows how far it got).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

_FENCE = re.compile(r"^```\s*([\w+-]*)[^`]*$")


@dataclasses.dataclass
class Block:
    """One fenced block: ``index`` counts the page's ``python`` blocks from 1 (0 for other languages)."""

    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    index: int = 0
    expected_output: str | None = None


def parse_blocks(text: str) -> list[Block]:
    """Every top-level fenced block of ``text``, with expected outputs attached to ``python`` blocks.

    Raises:
        ValueError: a fence is never closed (the message gives its line).
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    last_end: int | None = None  # line index just after the previous block's closing fence
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"the code fence opened at line {start + 1} is never closed")
        block = Block(lang=match.group(1) or "", code="\n".join(lines[start + 1 : j]) + "\n", line=start + 1)
        gap_is_blank = last_end is not None and all(not ln.strip() for ln in lines[last_end:start])
        previous = blocks[-1] if blocks else None
        if block.lang == "text" and gap_is_blank and previous is not None and previous.lang == "python":
            previous.expected_output = block.code
        blocks.append(block)
        last_end = j + 1
        i = j + 1
    number = 0
    for block in blocks:
        if block.lang == "python":
            number += 1
            block.index = number
    return blocks


def python_blocks(path: Path) -> list[Block]:
    """The ``python`` blocks of the page at ``path``, in order."""
    return [b for b in parse_blocks(path.read_text()) if b.lang == "python"]


def _normal_lines(text: str) -> list[str]:
    """Lines with runs of whitespace collapsed to one space; blank lines dropped."""
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _pattern(expected: str) -> re.Pattern[str]:
    parts = []
    for line in _normal_lines(expected):
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")  # any number of whole lines, none included
        else:
            parts.append(r"[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def output_mismatch(expected: str, got: str) -> str | None:
    """``None`` when ``got`` matches ``expected``, else a diff.

    Whitespace runs count as one space and blank lines are ignored. A line that is only ``...``
    stands for any number of lines (none included); ``...`` inside a line for any text on that line.
    """
    body = "".join(line + "\n" for line in _normal_lines(got))
    if _pattern(expected).fullmatch(body):
        return None
    diff = difflib.unified_diff(
        _normal_lines(expected), _normal_lines(got), "shown on the page", "printed", lineterm=""
    )
    return "\n".join(diff)


@dataclasses.dataclass
class PageRun:
    """The result of running one page: per-block stdout, and the failing block if any."""

    page: str
    outputs: dict[int, str]
    seconds: dict[int, float]
    error: dict | None
    returncode: int
    stderr_tail: str

    def problems(self, blocks: list[Block]) -> list[str]:
        """Human-readable failures: a block that raised, a wrong or undocumented output, a lost run."""
        found: list[str] = []
        if self.error is not None:
            found.append(
                f"{self.page} python block {self.error['index']} (line {self.error['line']}) raised:\n"
                f"{self.error['traceback']}"
            )
        elif len(self.outputs) != len(blocks):
            done = len(self.outputs)
            nxt = blocks[done] if done < len(blocks) else None
            where = f"python block {nxt.index} (line {nxt.line})" if nxt else "after the last block"
            found.append(
                f"{self.page}: the run stopped in {where} (exit code {self.returncode}); "
                f"stderr tail:\n{self.stderr_tail}"
            )
        failed = self.error["index"] if self.error is not None else None
        for block in blocks:
            if block.index not in self.outputs or block.index == failed:
                continue
            got = self.outputs[block.index]
            where = f"{self.page} python block {block.index} (line {block.line})"
            if block.expected_output is None:
                if got.strip():
                    found.append(
                        f"{where} prints output the page does not show; add a ```text block right after it:\n{got}"
                    )
                continue
            diff = output_mismatch(block.expected_output, got)
            if diff is not None:
                found.append(f"{where} printed something other than the page shows:\n{diff}")
        return found


def run_page(page: Path, workdir: Path, timeout: float, env: dict[str, str] | None = None) -> PageRun:
    """Run every ``python`` block of ``page`` in a new Python process whose working directory is ``workdir``."""
    report = workdir / ".blocks-report.json"
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(page.resolve()), str(report)],
            cwd=workdir,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        returncode, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = -1
        stderr = f"timed out after {timeout:.0f} s\n" + (
            exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        )
    data = (
        json.loads(report.read_text()) if report.exists() else {"outputs": {}, "seconds": {}, "error": None}
    )
    return PageRun(
        page=page.name,
        outputs={int(k): v for k, v in data["outputs"].items()},
        seconds={int(k): v for k, v in data["seconds"].items()},
        error=data["error"],
        returncode=returncode,
        stderr_tail=stderr[-4000:],
    )


# ------------------------------------------------------------------------------ runner (subprocess)
def _write(report: Path, data: dict) -> None:
    tmp = report.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, report)


def _main(page: Path, report: Path) -> int:
    if os.environ.get("LIGHTREC_BLOCK_FBGEMM", "") not in ("", "0"):
        # the suite's fbgemm-less variant: the page must see the same world as the tests
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.fbgemm_block import install_fbgemm_block

        install_fbgemm_block()
    blocks = python_blocks(page)
    namespace: dict = {"__name__": "__main__"}
    data: dict = {"outputs": {}, "seconds": {}, "error": None}
    _write(report, data)
    for block in blocks:
        filename = f"{page.name} python block {block.index} (line {block.line})"
        out = io.StringIO()
        started = time.perf_counter()
        try:
            code = compile(block.code, filename, "exec", dont_inherit=True)
            with contextlib.redirect_stdout(out):
                exec(code, namespace)  # noqa: S102 - running the page's code is the point
        except BaseException:  # noqa: BLE001 - SystemExit from a CLI call is a failure too
            data["error"] = {"index": block.index, "line": block.line, "traceback": traceback.format_exc()}
            data["outputs"][str(block.index)] = out.getvalue()
            _write(report, data)
            return 1
        data["outputs"][str(block.index)] = out.getvalue()
        data["seconds"][str(block.index)] = round(time.perf_counter() - started, 3)
        _write(report, data)
    return 0


if __name__ == "__main__":
    sys.exit(_main(Path(sys.argv[1]), Path(sys.argv[2])))
