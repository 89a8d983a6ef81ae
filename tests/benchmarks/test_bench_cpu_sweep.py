"""``benchmarks/bench_cpu_sweep.py``: its summary arithmetic, its grid options, and a tiny run of both modes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench() -> ModuleType:
    # Imported by name from its folder (not from a file spec): its spawned rank processes import it so too.
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import bench_cpu_sweep

    return bench_cpu_sweep


def _cell(mode: str, dim: int, ratio: float | None, load: float = 1.0) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": mode, "threads": 1, "dim": dim, "ids": 1, "optimizer": "sgd",
                           "lightrec": {"samples_per_s": 100.0, "kernels": ["torch"]},
                           "load_average_1min": {"before": load, "after": load + 1.0}}  # fmt: skip
    if ratio is not None:
        out |= {
            "ratio": ratio,
            "paired_ratios": [ratio],
            "cpu_ratio": ratio,
            "torchrec": {"samples_per_s": 1.0},
        }
    return out


def test_summary_gives_the_minimum_cell_and_the_geometric_mean_per_mode_and_overall() -> None:
    bench = _bench()
    cells = [_cell("single", 16, 0.5), _cell("single", 64, 2.0, load=3.0), _cell("ranks", 16, 1.5)]
    summary = bench.summarize(cells)
    assert summary["single"]["min_ratio"] == 0.5 and "dim=16" in summary["single"]["min_cell"]
    assert math.isclose(summary["single"]["geomean_ratio"], 1.0)
    assert summary["single"]["cells_below_1"] == 1
    assert summary["single"]["load_average_1min_range"] == [1.0, 4.0]
    assert summary["ranks"]["cells"] == 1 and summary["all"]["cells"] == 3 and summary["sgd"]["cells"] == 3
    assert "adam" not in summary  # no cell of it
    assert math.isclose(summary["all"]["geomean_ratio"], 1.5 ** (1 / 3))
    assert "ratio" not in bench.format_cell(_cell("single", 16, None))  # lightrec alone: no ratio printed
    assert "ratio 2.00x" in bench.format_cell(cells[1]) and "load 3.0->4.0" in bench.format_cell(cells[1])


def test_lightrec_alone_has_no_summary() -> None:
    assert _bench().summarize([_cell("single", 16, None)]) == {}


def test_grid_options_take_a_subset_and_refuse_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    args = bench.parse_args(["--threads", "1", "--dims", "64", "--ids", "1", "--optimizers", "rowwise_adagrad",
                             "--modes", "single"])  # fmt: skip
    assert (args.threads, args.dims, args.ids, args.optimizers, args.modes) == (
        [1], [64], [1], ["rowwise_adagrad"], ["single"])  # fmt: skip
    with pytest.raises(SystemExit):
        bench.parse_args(["--ids", "0"])
    assert "--ids takes positive integers, got [0]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--optimizers", "lamb"])


@pytest.mark.slow
def test_a_tiny_sweep_runs_both_modes_and_writes_its_report(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "sweep.json"
    report = bench.main(["--threads", "1", "--dims", "16", "--ids", "1", "8", "--optimizers", "rowwise_adagrad",
                         "--tables", "2", "--rows", "500", "--batch", "32", "--windows", "2", "--steps", "1",
                         "--warmup", "1", "--num-batches", "2", "--cell-timeout", "600", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    cells = report["cells"]
    assert [(c["mode"], c["ids"]) for c in cells] == [
        ("single", 1),
        ("single", 8),
        ("ranks", 1),
        ("ranks", 8),
    ]
    for c in cells:
        assert c["lightrec"]["samples_per_s"] > 0 and len(c["lightrec"]["windows_samples_per_s"]) == 2
        assert c["lightrec"]["kernels"] and set(c["load_average_1min"]) == {"before", "after"}
    if bench.torchrec_missing():  # the main venv: lightrec alone, and the report says why
        assert report["torchrec"].startswith("torchrec is not importable") and report["summary"] == {}
    else:
        assert all(c["ratio"] > 0 for c in cells) and report["summary"]["all"]["cells"] == 4
