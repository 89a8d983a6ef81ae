"""Every recipe runs offline from an empty folder; data prepared inside the run sizes the tables
(issue 16, item 2)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from lightrec.cli import main as lightrec
from lightrec.recipes import RECIPES
from tests.recipes.helpers import write_criteo_kaggle
from tests.recipes.test_recipes import COMMON, run_config

TINY = {
    "dlrm": ["--data.init_args.num_embeddings_cap=300", "--data.init_args.batch_size=64"],
    "two_tower": ["--data.init_args.synthetic_size=[60, 80, 4000]", "--data.init_args.batch_size=64"],
    "deepfm": ["--data.init_args.synthetic_size=[60, 80, 4000]", "--data.init_args.batch_size=64"],
}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails, as on a machine without network."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network access is disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_runs_offline_from_an_empty_folder(
    recipe: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_network: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    script = RECIPES[recipe].script
    # dlrm_online publishes the rows its sharded tables changed (DeltaPublisher): it keeps RecStrategy
    strategy = "lightrec" if recipe == "dlrm_online" else "auto"
    args = ["run", recipe, "--devices", "1", "--trainer.strategy", strategy, *COMMON[2:], *TINY[script]]
    assert lightrec(args) == 0
    out = capsys.readouterr().out
    metric = "recall@10=" if script == "two_tower" else "auc="
    assert "lightrec recipe finished" in out and metric in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning_logs"]  # nothing downloaded, no data/
    checkpoints = list((tmp_path / "lightning_logs").glob("*/version_0/checkpoints/*"))
    assert [p.name for p in checkpoints] == ["last.ckpt"]  # one checkpoint by default, not two copies


def test_raw_criteo_is_preprocessed_inside_the_run_and_sizes_the_tables(
    tmp_path: Path, criteo_dir: Path, movielens_dir: Path
) -> None:
    """dlrm_criteo.yaml's documented path: raw_inputs preprocessed by prepare_data, then the tables
    are sized from the result in configure_model (they were sized before prepare_data ran)."""
    import json

    raw = write_criteo_kaggle(tmp_path / "raw" / "train.txt", rows=400, seed=1)
    out_dir = tmp_path / "preprocessed"
    cli = run_config(
        "dlrm_criteo",
        tmp_path / "logs",
        criteo_dir,
        movielens_dir,
        [
            f"--data.init_args.data_dir={out_dir}",
            f"--data.init_args.raw_inputs=[{raw}]",
            "--data.init_args.preprocess_kwargs={num_embeddings_cap: 150, progress: false}",
            "--recipe.test_after_fit=false",
        ],
    )
    assert cli.trainer.global_step == 3
    meta = json.loads((out_dir / "meta.json").read_text())
    sizes = [t["num_embeddings"] for t in cli.model.tables]
    assert sizes == list(meta["num_embeddings_per_feature"]) and max(sizes) <= 150
    # The sizes are hyper-parameters, so load_from_checkpoint rebuilds the same tables.
    assert cli.model.hparams["tables"] == cli.model.tables
