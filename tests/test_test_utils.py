"""``lightrec.test_utils`` (torchrec's ``torchrec.test_utils``): ports, sanitizer skips, seeding."""

from __future__ import annotations

import io
import random
import socket
import unittest

import numpy as np
import pytest
import torch

from lightrec import test_utils
from lightrec.test_utils import get_free_port, seed_and_log, skip_if_asan, skip_if_asan_class


def test_get_free_port_can_be_bound_on_localhost() -> None:
    port = get_free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_skip_if_asan_runs_normally_and_skips_under_a_sanitizer(monkeypatch: pytest.MonkeyPatch) -> None:
    @skip_if_asan
    def add(a: int, b: int = 1) -> int:
        return a + b

    assert not test_utils.is_asan_or_tsan()  # this interpreter is not sanitized
    assert add(2, b=3) == 5 and add.__name__ == "add"
    monkeypatch.setattr(test_utils, "is_asan", lambda: True)
    with pytest.raises(unittest.SkipTest, match="AddressSanitizer"):
        add(2)


def test_skip_if_asan_class_marks_a_test_case(monkeypatch: pytest.MonkeyPatch) -> None:
    class Plain(unittest.TestCase):
        def test_x(self) -> None:
            pass

    assert skip_if_asan_class(Plain) is Plain and not getattr(Plain, "__unittest_skip__", False)
    monkeypatch.setattr(test_utils, "is_tsan", lambda: True)

    class Sanitized(unittest.TestCase):
        def test_x(self) -> None:
            raise AssertionError("must not run")

    skip_if_asan_class(Sanitized)
    result = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(Sanitized))
    assert result.wasSuccessful() and len(result.skipped) == 1


def test_seed_and_log_seeds_every_generator_and_prints_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    @seed_and_log
    def draw() -> tuple[float, float, float]:
        return torch.rand(1).item(), random.random(), float(np.random.rand())

    values = draw()
    seed = int(capsys.readouterr().out.strip().removeprefix("Using random seed: "))
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    assert values == (torch.rand(1).item(), random.random(), float(np.random.rand()))
