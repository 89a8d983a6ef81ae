"""The environment switches (``lightrec._switches``): one table in the code, the same table in
docs/switches.md, one polarity, old names that still work (with one warning), and no variable read
around the table."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

from lightrec import _switches
from lightrec._switches import FOREIGN, SWITCHES, Foreign, Switch, SwitchError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "switches.md"
# Variables of the test suite and CI, read by tests/ and .ci/ only (docs/switches.md, "Test suite").
HARNESS = ("LIGHTREC_BLOCK_FBGEMM", "LIGHTREC_CI_VENV")
OLD_NAMES = {old.name: switch for switch in SWITCHES for old in switch.replaces}


def _code(text: str) -> str:
    return f"`{text}`" if text and " " not in text else text


def switch_row(switch: Switch[object]) -> list[str]:
    """A switch as a row of docs/switches.md's table: variable, kind, default, what it does, replaces."""
    kind = switch.kind
    if isinstance(switch, _switches.Choice):
        kind = "choice: " + ", ".join(f"`{c}`" for c in switch.choices)
    replaces = ", ".join(f"`{old.name}{old.meaning}`" for old in switch.replaces) or "--"
    return [f"`{switch.name}`", kind, _code(switch.default_text), switch.doc, replaces]


def foreign_row(variable: Foreign) -> list[str]:
    return [f"`{variable.name}`", variable.owner, variable.use]


def page_table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``## heading`` of docs/switches.md."""
    text = PAGE.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


def test_the_page_shows_the_code_table() -> None:
    """docs/switches.md's tables are the code's, row for row (regenerate the rows with switch_row /
    foreign_row when a switch changes)."""
    assert page_table("The switches") == [switch_row(s) for s in SWITCHES]
    assert page_table("Other tools' variables") == [foreign_row(v) for v in FOREIGN]
    assert [row[0] for row in page_table("Test suite")] == [f"`{name}`" for name in HARNESS]


def test_every_switch_is_declared_once_with_one_polarity() -> None:
    names = [s.name for s in SWITCHES] + list(OLD_NAMES)
    assert len(names) == len(set(names)), "a name declared twice"
    assert all(s.name.startswith("LIGHTREC_") for s in SWITCHES)
    on_off = [s for s in SWITCHES if isinstance(s, _switches.OnOff)]
    assert {s.name for s in on_off if s.default} >= {"LIGHTREC_NATIVE", "LIGHTREC_FBGEMM", "LIGHTREC_TRITON",
                                                     "LIGHTREC_SHM", "LIGHTREC_TIERED_NATIVE"}  # fmt: skip
    assert not any(s.name.startswith("LIGHTREC_DISABLE") for s in SWITCHES), "on/off switches are off at =0"


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("1", True), ("off", False), ("True", True), ("", True)])
def test_on_off_reads_0_as_off(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("LIGHTREC_TIERED_NATIVE", value)
    assert _switches.TIERED_NATIVE.read() is expected


def test_bad_values_name_the_switch_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", "maybe")
    with pytest.raises(SwitchError, match=r"LIGHTREC_SHM must be 0 \(off\) or 1 \(on\), got 'maybe'; unset it"):
        _switches.SHM.read()
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "tbe")
    with pytest.raises(SwitchError, match=r"LIGHTREC_CPU_KERNEL must be one of \['auto', 'fbgemm', 'torch'\]"):
        _switches.CPU_KERNEL.read()
    for bad in ("soon", "0", "-3", "inf"):
        monkeypatch.setenv("LIGHTREC_SHM_TIMEOUT", bad)
        with pytest.raises(SwitchError, match="LIGHTREC_SHM_TIMEOUT must be a positive number of seconds"):
            _switches.SHM_TIMEOUT.read()
    monkeypatch.setenv("LIGHTREC_SHM_TIMEOUT", "2.5")
    assert _switches.SHM_TIMEOUT.read() == 2.5


def test_defaults_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for switch in SWITCHES:
        monkeypatch.delenv(switch.name, raising=False)
        for old in switch.replaces:
            monkeypatch.delenv(old.name, raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    assert [s.read() for s in SWITCHES] == [
        True, True, True, True, True, True, True, True, "auto", "tuned",
        Path("/home/someone/.cache/lightrec"), Path("/dev/shm"), None, False,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "value", "switch", "expected"),
    [
        ("LIGHTREC_DISABLE_NATIVE", "1", "NATIVE", False),
        ("LIGHTREC_DISABLE_NATIVE", "0", "NATIVE", True),
        ("LIGHTREC_DISABLE_FBGEMM", "yes", "FBGEMM", False),
        ("LIGHTREC_DISABLE_TRITON", "1", "TRITON", False),
        ("LIGHTREC_CPU_UPDATE", "torch", "CPU_UPDATE_NATIVE", False),
        ("LIGHTREC_CPU_UPDATE", "native", "CPU_UPDATE_NATIVE", True),
        ("LIGHTREC_MCH_STEP", "torch", "MCH_NATIVE", False),
    ],
)
def test_old_names_still_work_and_warn_once_with_the_new_spelling(
    monkeypatch: pytest.MonkeyPatch, old: str, value: str, switch: str, expected: bool
) -> None:
    target: Switch[object] = getattr(_switches, switch)
    monkeypatch.delenv(target.name, raising=False)
    monkeypatch.setenv(old, value)
    monkeypatch.setattr(_switches, "_warned", set())
    with pytest.warns(_switches.RenamedSwitchWarning, match=rf"{old} is an old name of {target.name}") as caught:
        assert target.read() is expected
    assert issubclass(caught[0].category, DeprecationWarning)
    if not expected:
        assert f"set {target.name}=0" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert target.read() is expected  # once per process
    monkeypatch.setenv(target.name, "1" if not expected else "0")  # the new name wins
    assert target.read() is (not expected)


def test_old_names_reach_the_code_that_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The places that read a switch honour its old spelling (here: the managed-collision step and
    the CPU update, read per call)."""
    import torch

    from lightrec.kernels.cpu_update import native_update_available
    from lightrec.modules.managed_collision.mch_native import native_step_available

    monkeypatch.setattr(_switches, "_warned", set())
    monkeypatch.setenv("LIGHTREC_MCH_STEP", "torch")
    monkeypatch.setenv("LIGHTREC_CPU_UPDATE", "torch")
    with pytest.warns(DeprecationWarning):
        assert not native_step_available(torch.device("cpu"))
        assert not native_update_available(torch.device("cpu"), torch.float32)


def _literal_reads(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every ``os.environ.get("X")`` / ``os.environ["X"]`` / ``os.getenv("X")`` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            if isinstance(func, ast.Attribute) and (
                (func.attr in ("get", "pop", "setdefault") and isinstance(func.value, ast.Attribute)
                 and func.value.attr == "environ") or func.attr == "getenv"
            ):  # fmt: skip
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
            if isinstance(node.slice, ast.Constant):
                key = node.slice.value
        if isinstance(key, str):
            found.append((node.lineno, key))
    return found


def test_lightrec_reads_no_variable_around_the_table() -> None:
    """Every variable named in an environment read of lightrec/ is a declared foreign one; the
    switches are read only through their accessor (so only _switches.py names them in a read)."""
    foreign = {v.name for v in FOREIGN}
    stray = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "lightrec").rglob("*.py"))
        if path.name != "_switches.py"
        for line, name in _literal_reads(path)
        if name not in foreign
    ]
    assert not stray, "read through lightrec._switches (or declare a foreign variable in FOREIGN):\n" + "\n".join(stray)


def test_fabric_run_variables_are_declared() -> None:
    from lightrec.lightning.recipe.cli import _FABRIC_RUN_ENV

    assert {"LT_CLI_USED", *(var for var, _ in _FABRIC_RUN_ENV)} <= {v.name for v in FOREIGN}


def test_only_current_names_appear_outside_the_table() -> None:
    """lightrec/, the docs, the tests, CI and the benchmarks use the new names; the old ones appear only
    in the table, in this file (which checks they still work) and in the CHANGELOG."""
    current = {s.name for s in SWITCHES} | set(HARNESS)
    files = [
        *(ROOT / "lightrec").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "recipes").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md", *(ROOT / ".ci").iterdir(),
    ]  # fmt: skip
    table = {ROOT / "lightrec" / "_switches.py", Path(__file__).resolve()}  # declare and test the old names
    bad = []
    for path in files:
        if not path.is_file() or path.suffix not in (".py", ".md", "") or path in table:
            continue
        for name in set(re.findall(r"\bLIGHTREC_[A-Z0-9_]*[A-Z0-9]", path.read_text())):
            if name in current or (name in OLD_NAMES and path == PAGE):
                continue
            bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "\n".join(sorted(bad))


def test_the_switches_import_nothing_of_lightrec() -> None:
    tree = ast.parse((ROOT / "lightrec" / "_switches.py").read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in imported if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("lightrec")]
