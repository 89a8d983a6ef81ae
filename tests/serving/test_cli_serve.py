"""``lightrec serve``'s refusals, in process: every one comes before any server process starts, as
one line naming the option, with exit code 2 (a user mistake) or 1 (something to install). The
command serving requests is ``test_server.py``'s module server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lightrec.cli.app import main
from lightrec.inference import export
from lightrec.serving import ServeConfig
from tests.inference.helpers import dlrm

pytest.importorskip("litserve")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("cli") / "m.pt")


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], code: int) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("lightrec serve: error:") or "usage:" in err, err
    return err


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--deltas", "--port", "--workers", "--max-batch-size", "--batch-timeout-ms", "--accelerator",
                   "--devices", "--host", "--max-queue", "--max-payload-mb"):
        assert option in out
    assert f"default {ServeConfig.max_batch_size}" in out and "127.0.0.1" in out


def test_bad_arguments_exit_2_naming_the_option(artifact: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert "does not exist" in _refused(["serve", str(tmp_path / "missing.pt")], capsys, 2)
    (tmp_path / "bare.pt").write_bytes(b"x")
    assert "meta.json' is missing" in _refused(["serve", str(tmp_path / "bare.pt")], capsys, 2)
    assert "--port 80" in _refused(["serve", str(artifact), "--port", "80"], capsys, 2)
    assert "--host '10.1.2.3'" in _refused(["serve", str(artifact), "--host", "10.1.2.3"], capsys, 2)
    assert "is not a folder" in _refused(["serve", str(artifact), "--deltas", str(tmp_path / "nope")], capsys, 2)
    with pytest.raises(SystemExit):  # argparse: not a positive integer
        main(["serve", str(artifact), "--workers", "0"])
    assert "positive integer" in capsys.readouterr().err


def test_without_litserve_the_command_says_how_to_install_it(artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "litserve" else real(name, *a))
    assert 'pip install "lightrec[serve]"' in _refused(["serve", str(artifact)], capsys, 1)
