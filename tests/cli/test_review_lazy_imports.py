"""The commands that need no Lightning do not import it: building the ``lightrec`` parser, ``--help``,
``--version``, ``ls``, ``serve`` up to its own work, ``data`` and ``consolidate`` refusing a path.

``lightrec serve`` re-imports the command in its HTTP process and in every LitServe worker, and Lightning
took seconds of each start; each check runs in a fresh interpreter, where ``sys.modules`` starts clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Runs each step in turn in one fresh interpreter -- ``main(argv)``, or only ``build_parser()`` for None --
# and prints, as the last line, each step's exit code, output and the heavy modules imported so far.
_PROBE = """
import contextlib, io, json, sys
from lightrec.cli.app import build_parser, main
steps = []
for argv in json.loads(sys.argv[1]):
    code = 0
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            if argv is None:
                build_parser()
            else:
                code = main(argv)
        except SystemExit as exc:
            code = exc.code
    heavy = sorted(m for m in ("lightning", "lightning.pytorch", "pyarrow") if m in sys.modules)
    steps.append({"argv": argv, "code": code, "heavy": heavy, "output": out.getvalue() + err.getvalue()})
print(json.dumps(steps))
"""

# (arguments, exit code), in the order run; the data step, last, may import pyarrow (not Lightning).
STEPS: list[tuple[list[str] | None, int]] = [
    (None, 0),  # build_parser()
    ([], 0),  # the help
    (["--help"], 0),
    (["--version"], 0),
    (["ls"], 0),
    (["run", "--help"], 0),
    (["serve", "--help"], 0),
    (["serve", "model.pt", "--bogus"], 2),
    (["consolidate", "no_such.ckpt", "full.ckpt"], 2),
    (["export", "no_such.ckpt"], 2),
    (["data", "inspect", "no_such.parquet"], 2),
]


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    argvs = [argv for argv, _ in STEPS]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs)],
        cwd=tmp_path_factory.mktemp("lazy"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result: list[dict[str, object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("index", range(len(STEPS)), ids=[str(argv) for argv, _ in STEPS])
def test_a_command_that_needs_no_lightning_does_not_import_it(steps: list[dict[str, object]], index: int) -> None:
    step, (argv, code) = steps[index], STEPS[index]
    assert step["argv"] == argv
    assert step["code"] == code, step["output"]
    allowed = ["pyarrow"] if argv is not None and argv[:1] == ["data"] else []
    assert step["heavy"] == allowed, step
    if code == 2 and argv is not None and argv[0] != "serve":  # the command's own refusal, as before
        assert f"lightrec {argv[0]}: error: " in str(step["output"]), step


def test_ls_output_is_whole_without_lightning(steps: list[dict[str, object]]) -> None:
    from lightrec.recipes import CONFIGS, RECIPES

    output = str(steps[[argv for argv, _ in STEPS].index(["ls"])]["output"])
    assert output.startswith("recipes (lightrec run <recipe>):\n"), output
    for name in [*RECIPES, *CONFIGS]:
        assert f"\n  {name} " in output, (name, output)


def test_a_mistyped_recipe_still_gets_its_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint's helper lives with the recipe checks (a Lightning module): imported for the error only."""
    from lightrec.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["cp", "dlrn", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "lightrec cp: error: unknown recipe 'dlrn' (did you mean 'dlrm'?); valid recipes: " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
