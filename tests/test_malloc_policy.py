"""The glibc malloc policy of training ranks (``lightrec._malloc_policy``): what it sets, what wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightrec._malloc_policy import MALLOC_POLICIES, resolve_malloc_policy

ROOT = Path(__file__).resolve().parents[1]
VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def test_resolve_names_mappings_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIGHTREC_MALLOC_POLICY", raising=False)
    assert (
        resolve_malloc_policy(None)
        == MALLOC_POLICIES["tuned"]
        == {
            "MALLOC_MMAP_THRESHOLD_": 32 << 20,
            "MALLOC_TRIM_THRESHOLD_": 1 << 30,
        }
    )
    assert resolve_malloc_policy("default") == {}
    monkeypatch.setenv("LIGHTREC_MALLOC_POLICY", "default")
    assert resolve_malloc_policy(None) == {}
    assert resolve_malloc_policy({"MALLOC_TRIM_THRESHOLD_": 5}) == {"MALLOC_TRIM_THRESHOLD_": 5}
    with pytest.raises(ValueError, match="malloc_policy must be one of.*got 'fast'"):
        resolve_malloc_policy("fast")
    with pytest.raises(ValueError, match="sets only .*MALLOC_MMAP_THRESHOLD_.*got"):
        resolve_malloc_policy({"MALLOC_ARENA_MAX": 2})
    with pytest.raises(ValueError, match="non-negative"):
        resolve_malloc_policy({"MALLOC_TRIM_THRESHOLD_": -1})


def _child(code: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in VARS and k != "LIGHTREC_MALLOC_POLICY"}
    result = subprocess.run(
        [sys.executable, "-c", code], env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.slow  # 15 s of subprocesses; the default suite sees the policy applied by RecStrategy below
def test_apply_sets_the_environment_ranks_inherit_and_keeps_the_users_values() -> None:
    code = (
        "import os; from lightrec._malloc_policy import apply_malloc_policy; "
        "print(apply_malloc_policy(None), os.environ.get('MALLOC_MMAP_THRESHOLD_'), "
        "os.environ.get('MALLOC_TRIM_THRESHOLD_'))"
    )
    assert _child(code, {}) == (
        "{'MALLOC_MMAP_THRESHOLD_': 33554432, 'MALLOC_TRIM_THRESHOLD_': 1073741824} 33554432 1073741824"
    )
    # The user's own variable wins; the other one is still set.
    assert _child(code, {"MALLOC_MMAP_THRESHOLD_": "65536"}) == (
        "{'MALLOC_MMAP_THRESHOLD_': 65536, 'MALLOC_TRIM_THRESHOLD_': 1073741824} 65536 1073741824"
    )
    assert _child(code, {"LIGHTREC_MALLOC_POLICY": "default"}) == "{} None None"


def test_rec_strategy_applies_its_policy() -> None:
    code = (
        "import os; from lightrec.lightning import RecStrategy; "
        "s = RecStrategy(malloc_policy={'MALLOC_TRIM_THRESHOLD_': 7 << 20}); "
        "print(s.malloc_policy, os.environ.get('MALLOC_TRIM_THRESHOLD_'), os.environ.get('MALLOC_MMAP_THRESHOLD_'))"
    )
    assert _child(code, {}) == "{'MALLOC_TRIM_THRESHOLD_': 7340032} 7340032 None"
    default = "from lightrec.lightning import RecStrategy; print(RecStrategy().malloc_policy)"
    assert _child(default, {}) == "{'MALLOC_MMAP_THRESHOLD_': 33554432, 'MALLOC_TRIM_THRESHOLD_': 1073741824}"


@pytest.mark.slow  # ~18 s, two CLI processes; the default suite sees RecStrategy apply the policy above
def test_lightrec_run_passes_its_choice_to_the_recipe_without_the_environment(tmp_path: Path) -> None:
    """``lightrec run --malloc-policy default``: the recipe's ``RecStrategy(malloc_policy=None)`` resolves
    to it (the ranks Lightning launches re-run the same command line); nothing is tuned and
    ``LIGHTREC_MALLOC_POLICY`` is not written. Without the flag: tuned."""
    recipe = tmp_path / "probe.py"
    recipe.write_text(
        "import os\n"
        "from lightrec._malloc_policy import resolve_malloc_policy\n"
        "def main(args):\n"
        "    print('policy', resolve_malloc_policy(None), os.environ.get('LIGHTREC_MALLOC_POLICY'),\n"
        "          os.environ.get('MALLOC_TRIM_THRESHOLD_'))\n"
    )
    run = "import sys; from lightrec.cli import main; sys.exit(main(sys.argv[1:]))"
    tuned = resolve_malloc_policy("tuned")
    for flag, expected in (
        (["--malloc-policy", "default"], "policy {} None None"),
        ([], f"policy {tuned} None 1073741824"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", run, "run", str(recipe), *flag], capture_output=True, text=True, timeout=120,
            env={**{k: v for k, v in os.environ.items() if k not in VARS and k != "LIGHTREC_MALLOC_POLICY"},
                 "PYTHONPATH": str(ROOT)},
        ).stdout  # fmt: skip
        assert expected in out, (flag, out)


def test_an_unknown_policy_in_the_environment_names_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_MALLOC_POLICY", "fast")
    with pytest.raises(ValueError, match=r"LIGHTREC_MALLOC_POLICY must be one of \['tuned', 'default'\], got 'fast'"):
        resolve_malloc_policy(None)
