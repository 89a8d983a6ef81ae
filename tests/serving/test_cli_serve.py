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
                   "--devices", "--host", "--max-queue", "--max-queue-mb", "--max-payload-mb"):
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


@pytest.mark.parametrize("option", ["--max-payload-mb", "--max-queue-mb", "--follow-interval", "--timeout",
                                    "--body-timeout", "--batch-timeout-ms"])  # fmt: skip
@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_numbers_must_be_finite(artifact: Path, option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, before anything starts
        main(["serve", str(artifact), option, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert option in err and f"got {value!r}" in err and "finite" in err, err


@pytest.mark.parametrize("value", ["0", "0.0", "0.00", "0e0", "00", "-0"])
def test_a_zero_batch_timeout_is_read_in_any_spelling(value: str) -> None:
    import argparse

    from lightrec.cli import serve as serve_command

    parser = argparse.ArgumentParser()
    serve_command.register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m.pt", "--batch-timeout-ms", value]).batch_timeout_ms == 0.0


@pytest.mark.parametrize("field", ["max_payload_mb", "max_queue_mb", "follow_interval_s", "timeout_s",
                                   "body_timeout_s", "batch_timeout_ms"])  # fmt: skip
def test_config_numbers_must_be_finite(artifact: Path, field: str) -> None:
    import dataclasses
    import math

    from lightrec.serving import ServeConfigError

    with pytest.raises(ServeConfigError, match=r"--[a-z-]+ inf: give a finite positive number"):
        dataclasses.replace(ServeConfig(artifact), **{field: math.inf}).check()


def test_a_byte_budget_below_the_payload_limit_is_refused(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightrec.serving import ServeConfigError

    err = _refused(["serve", str(artifact), "--max-queue-mb", "4", "--max-payload-mb", "8"], capsys, 2)
    assert "--max-queue-mb 4 is below --max-payload-mb 8" in err and "could never be admitted" in err, err
    with pytest.raises(ServeConfigError, match="--max-queue-mb 1 is below --max-payload-mb 8"):
        ServeConfig(artifact, max_queue_mb=1).check()
    ServeConfig(artifact, max_queue_mb=8, max_payload_mb=8).check()  # equal: one largest body fits


def test_deltas_with_packed_dense_layers_are_refused_at_start_up(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from lightrec.inference import quantize
    from lightrec.serving import ServeConfigError

    packed = export(quantize(dlrm(), dtype="int8", quantize_dense=True), tmp_path / "qd.pt")
    (tmp_path / "publish").mkdir()
    with pytest.raises(ServeConfigError, match="quantize_dense=True"):  # checked before any process starts
        ServeConfig(packed, deltas=tmp_path / "publish").check()
    err = _refused(["serve", str(packed), "--deltas", str(tmp_path / "publish")], capsys, 2)
    assert "quantize_dense=True" in err and "Re-export it with quantize_dense=False" in err
    ServeConfig(packed).check()  # served as is, without --deltas, it is fine
    plain = export(quantize(dlrm(), dtype="int8"), tmp_path / "q.pt")
    ServeConfig(plain, deltas=tmp_path / "publish").check()
