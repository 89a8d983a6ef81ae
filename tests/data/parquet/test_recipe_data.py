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
@pytest.mark.parametrize("recipe", ["dlrm", "deepfm"])  # two_tower: (user, item) pairs, below
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


def _write_pairs(folder: Path, rows: int = 400) -> None:
    """Positive (user, item) pairs with a user feature and an item feature, in 2 files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        user = rng.integers(0, 50, rows // 2)
        item = (user * 7 + rng.integers(0, 3, rows // 2)) % 80  # each user prefers a few items
        pq.write_table(pa.table({
            "user_id": user, "user_group": user % 5, "item_id": item, "item_genre": item % 6,
            "label": np.ones(rows // 2, dtype=np.int64),
        }), folder / f"part-{part}.parquet", row_group_size=100)  # fmt: skip


def test_two_tower_trains_on_parquet_pairs_and_refuses_click_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Parquet folder of (user, item) pairs is the two_tower recipe's data (``task: retrieval``, from
    its config's data section; towers split by ``candidate_feature_names``); ``--data.task ctr``
    (click data) is refused with what the recipe needs."""
    from lightrec.data import ParquetDataModule

    _write_pairs(tmp_path / "pairs")
    monkeypatch.chdir(tmp_path)
    common = ["run", "two_tower", "--data", "parquet", "--data.path", str(tmp_path / "pairs"), "--data.label", "label",
              "--data.dense", "[]", "--data.batch_size", "32", "--data.val", "0.2", "--data.test", "0.2", "--devices", "1",
              "--trainer.strategy", "auto", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
              "--trainer.enable_progress_bar", "false", "--recipe.export", "false",
              "--model.candidate_feature_names", "[item_id, item_genre]"]  # fmt: skip
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "lightrec recipe finished" in out and "recall@" in out, out[-3000:]
    assert main([*common, "--data.task", "ctr"]) == 2  # click data: the recipe names what it needs
    assert "--data parquet --data.task retrieval" in capsys.readouterr().err
    with pytest.raises(ValueError, match="task must be 'ctr' .* or 'retrieval' .* got 'pairs'"):
        ParquetDataModule(str(tmp_path / "pairs"), task="pairs")  # type: ignore[arg-type]
