"""The test harness itself: ports for ``pytest -n`` workers, the device fixture, the NCCL helper."""

from __future__ import annotations

import pytest

import tests.multiprocess as multiprocess


def test_xdist_workers_draw_ports_from_disjoint_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: dict[str, list[int]] = {}
    for worker in ("gw0", "gw1", "gw7"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(multiprocess, "_next_offset", 0)
        taken[worker] = [multiprocess.free_port() for _ in range(5)]
    for worker, ports in taken.items():
        n = int(worker[2:])
        assert len(set(ports)) == 5, ports  # never the same port twice in one worker
        lo = multiprocess._BASE + n * multiprocess._SPAN
        assert all(lo <= p < lo + multiprocess._SPAN < 32_768 for p in ports), (worker, ports)


def test_without_xdist_the_os_picks_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert multiprocess._bindable(multiprocess.free_port())


def test_device_fixture_gives_cpu_here(device) -> None:  # noqa: ANN001
    assert device.type in ("cpu", "cuda")


def test_nccl_helper_refuses_without_enough_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiprocess.torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="needs 1 CUDA device"):
        multiprocess.run_nccl(_never)


def _never(rank: int, world_size: int) -> None:
    raise AssertionError("not reached")
