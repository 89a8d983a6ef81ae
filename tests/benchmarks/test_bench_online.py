"""``benchmarks/bench_online.py`` at a tiny setting (slow: two gloo ranks train a small DLRM): every
figure is reported, and each delta holds rows (in the asked row format)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_online.py"


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["fp32", "int8"])
def test_bench_online_reports_every_figure(tmp_path: Path, row_format: str) -> None:
    import json

    out = tmp_path / "online.json"
    args = ["--rows", "500", "--batch-size", "64", "--steps", "4", "--repeats", "1", "--warmup", "1",
            "--num-batches", "2", "--row-format", row_format, "--out", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["step_ms"]) == {"plain", "tracked", "published", "published_sync"}
    assert all(v > 0 for v in report["step_ms"].values())
    for key in ("tracking_overhead_pct", "publish_overhead_pct", "publish_sync_overhead_pct", "publish_latency_ms",
                "publish_background_ms", "publish_sync_latency_ms"):
        assert isinstance(report[key], float), key
    assert 0 < report["delta_rows"] <= 26 * 500
    per_row = 64 * 4 if row_format == "fp32" else 64 + 8  # int8 rows: 64 bytes + fp32 scale and bias
    assert report["delta_bytes"] >= report["delta_rows"] * per_row
    assert report["config"]["row_format"] == row_format
