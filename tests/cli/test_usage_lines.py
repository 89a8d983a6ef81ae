"""A subcommand's usage line and usage errors name it: ``lightrec <cmd>``, never ``lightrec`` alone (nor
``__main__.py``), whether run as the console script or as ``python -m lightrec.cli``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightrec.cli import main

# (arguments, the subcommand the usage line and the error must name): errors the commands find
# themselves after argparse (an unknown recipe or config, arguments a command does not take).
COMMAND_ERRORS = [
    (["cp", "nosuch", "d"], "cp"),
    (["cp", "dlrm", "a", "b"], "cp"),
    (["ls", "extra"], "ls"),
    (["consolidate", "a", "b", "extra"], "consolidate"),
    (["export", "x.ckpt", "--bogus"], "export"),
    (["plan", "nosuch"], "plan"),
    (["plan", "dlrm", "--bogus"], "plan"),
    (["serve", "model.pt", "--bogus"], "serve"),
    (["run", "nosuch"], "run"),
    (["data", "inspect", "p", "--bogus"], "data inspect"),
]


@pytest.mark.parametrize(("argv", "command"), COMMAND_ERRORS, ids=[" ".join(a) for a, _ in COMMAND_ERRORS])
def test_a_command_usage_error_names_the_command(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: lightrec {command} "), err
    assert f"\nlightrec {command}: error: " in err, err


@pytest.mark.parametrize("command", ["run", "plan", "export", "consolidate", "cp", "ls", "serve", "data"])
def test_help_names_the_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    if command == "run":  # `lightrec run --help` prints the run parser's help (its recipes' is LightningCLI's)
        assert main([command, "--help"]) == 0
    else:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: lightrec {command} ")


def _console_script() -> Path | None:
    script = Path(sys.executable).with_name("lightrec")
    return script if script.is_file() else None


# A fresh interpreter each (~13 s on 2 shared cores): the slow suite starts all three; the default suite
# checks the same parser in process above.
@pytest.mark.parametrize(
    "how",
    [
        pytest.param("console script", marks=pytest.mark.slow),
        # what Lightning re-runs to start more ranks (the main job's 2-rank test runs it too)
        pytest.param("python -m lightrec.cli", marks=pytest.mark.slow),
        pytest.param("python -m lightrec", marks=pytest.mark.slow),
    ],
)
def test_both_entry_points_name_the_command(how: str, tmp_path: Path) -> None:
    if how == "console script":
        script = _console_script()
        if script is None:
            pytest.skip("the lightrec console script is not installed beside this Python")
        prefix = [str(script)]
    else:
        prefix = [sys.executable, "-m", how.split()[-1]]
    for argv, command in ((["cp", "nosuch", "d"], "cp"), (["cp", "--help"], "cp")):
        proc = subprocess.run([*prefix, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        text = proc.stdout + proc.stderr
        assert text.startswith(f"usage: lightrec {command} "), text
        assert "__main__" not in text and "-m lightrec" not in text, text
    assert proc.returncode == 0 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("before", [[], ["--devices", "1"], ["--accelerator", "cpu", "--num-nodes", "1"]])
def test_recipe_help_names_the_recipe_whatever_options_come_first(
    before: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``lightrec run --devices 1 dlrm --help`` is the dlrm recipe's LightningCLI help under the command
    the user typed (it read the word after ``run`` -- ``--devices`` -- as the recipe)."""
    assert main(["run", *before, "dlrm", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lightrec run dlrm "), out[:200]
