"""``benchmarks/bench_freshness.py`` at a small setting: deltas give the whole copies' scores, for fewer bytes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_freshness.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_freshness", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_freshness"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict:
    bench = _bench()
    config = bench.FreshnessConfig(tables=2, rows=100, batch=128, steps=30, cadences=(1, 4, 0), row_format="fp16",
                                   eviction_interval=3)  # fmt: skip
    return bench.freshness_table(config, tmp_path_factory.mktemp("freshness"))


def test_deltas_score_bit_for_bit_like_whole_copies_at_the_same_cadence(table: dict) -> None:
    scores = table["scores"]
    for cadence in ("1", "4"):
        np.testing.assert_array_equal(scores[f"delta_{cadence}"], scores[f"whole_{cadence}"])
        assert table["delta"][cadence]["auc"] == table["whole"][cadence]["auc"]
    assert "never" in table["whole"] and "never" not in table["delta"]  # one frozen copy serves both rows
    assert not np.array_equal(scores["whole_1"], scores["whole_never"])  # the refreshes changed what is served


def test_a_delta_carries_the_touched_rows_only(table: dict) -> None:
    whole, delta, rows = table["whole"], table["delta"], table["table_rows"]
    assert whole["1"]["refreshes"] == 14 and whole["4"]["refreshes"] == 3  # steps 16..29 / 19, 23, 27
    assert whole["1"]["rows_per_refresh"] == rows
    assert 0 < delta["1"]["rows_per_refresh"] < delta["4"]["rows_per_refresh"] <= rows
    assert delta["1"]["bytes_per_refresh"] < whole["1"]["bytes_per_refresh"]
    assert len(table["scores"]["labels"]) == 15 * 128
    assert all(0.0 <= v["auc"] <= 1.0 for v in [*whole.values(), *delta.values(), table["trainer"]])


def test_the_report_has_one_line_per_cadence(table: dict) -> None:
    text = _bench().report(table)
    assert text.splitlines()[0].startswith("refresh every") and "1 steps" in text and "never" in text
