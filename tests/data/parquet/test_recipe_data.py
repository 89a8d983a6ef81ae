"""Recipes take Parquet data: ``lightrec run dlrm --data parquet --data.path ... --data.label ...``."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrec.cli.app import main
from lightrec.lightning.recipe.cli import resolve_config_args
from tests.data.parquet.test_resume import write_rows


def test_data_shortcuts_name_the_datamodules(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("{}")
    args = resolve_config_args(["--data", "parquet", "--data=synthetic", "--data", "my.Module"], tmp_path, "a.yaml")
    assert args == ["fit", "--config", str(tmp_path / "a.yaml"), "--data", "lightrec.data.ParquetDataModule",
                    "--data=lightrec.data.SyntheticCriteo", "--data", "my.Module"]  # fmt: skip


@pytest.mark.slow  # the default suite trains configs/dlrm_parquet.yaml (tests/recipes/test_recipes.py)
@pytest.mark.parametrize("recipe", ["dlrm", "deepfm"])  # two_tower needs (user, item) pairs: it says so
def test_lightrec_run_trains_click_recipes_on_parquet_logs(
    recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rows(tmp_path / "logs")
    monkeypatch.chdir(tmp_path)
    code = main([
        "run", recipe, "--data", "parquet", "--data.path", str(tmp_path / "logs"), "--data.label", "label",
        "--data.dense", "[int_*]", "--data.batch_size", "32", "--data.val", "0.2", "--devices", "1",
        "--trainer.strategy", "auto", "--trainer.max_steps", "3", "--trainer.enable_progress_bar", "false",
        "--recipe.export", "false",
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "lightrec recipe finished" in out and "checkpoint: " in out


def test_a_missing_parquet_path_is_one_line_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", "dlrm", "--data", "parquet", "--data.path", "nowhere/", "--data.label", "click"])
    assert code == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Parquet files at" in err[0] and "lightrec data convert" in err[0]
