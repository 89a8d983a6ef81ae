"""``lightrec serve --port P`` where another process listens on P: a usage error naming ``--port``
(exit code 2) before the banner and before any server process starts, not uvicorn's ``Address already
in use`` in a log after the workers started (exit code 3)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from lightrec.cli.app import main
from lightrec.inference import export
from tests.inference.helpers import dlrm

pytest.importorskip("litserve")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("busy") / "m.pt")


def test_a_busy_port_is_a_usage_error_naming_the_option(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["serve", str(artifact), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightrec serve: error:"), err
    assert f"--port {port}" in err and "in use by another process" in err and "another --port" in err, err
    assert "http://" not in err  # refused before the banner: nothing claimed to serve


def test_a_port_in_time_wait_is_free(capsys: pytest.CaptureFixture[str]) -> None:
    from lightrec.serving.server import check_port_free

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its port enters TIME_WAIT
        client.close()
    check_port_free("127.0.0.1", port)  # as uvicorn binds (SO_REUSEADDR): no refusal
