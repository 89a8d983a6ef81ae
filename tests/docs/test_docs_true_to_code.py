"""Statements of the docs that issue 16 (item 8) found untrue, checked against the code."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightrec.recipes import CONFIGS_DIR

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_recipes_doc_says_what_the_configs_set_about_inference_mode() -> None:
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in CONFIGS_DIR.glob("*.yaml")}
    sets_it = {name for name, c in configs.items() if "inference_mode" in c.get("trainer", {})}
    text = (DOCS / "recipes.md").read_text()
    assert ("Configs set `trainer.inference_mode: false`" in text) == (sets_it == set(configs))
    assert not sets_it and "the configs leave it on" in text


def test_every_shipped_config_shows_the_plan_and_keeps_one_checkpoint() -> None:
    for path in CONFIGS_DIR.glob("*.yaml"):
        callbacks = yaml.safe_load(path.read_text())["trainer"]["callbacks"]
        paths = [c["class_path"] for c in callbacks]
        assert (
            "lightrec.lightning.PlanReport" in paths and "lightrec.lightning.RecThroughputMonitor" in paths
        ), path
        checkpoint = next(c["init_args"] for c in callbacks if c["class_path"].endswith("ModelCheckpoint"))
        assert checkpoint == {"save_last": True, "save_top_k": 0}, path


def test_samples_per_sec_is_logged_when_the_docs_say(tmp_path: Path) -> None:
    """docs/lightning.md: `train/samples_per_sec` every `log_every_n_steps` steps (it said every step)."""
    import lightning.pytorch as pl

    from tests.lightning.toy import ToyDLRM, toy_data

    logged: list[int] = []

    class Spy(ToyDLRM):
        def log(self, name: str, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            if name == "train/samples_per_sec":
                logged.append(self.trainer.global_step)
            super().log(name, *args, **kwargs)

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=7, log_every_n_steps=3, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Spy(), datamodule=toy_data())
    assert logged == [3, 6]
    text = (DOCS / "lightning.md").read_text()
    assert "| `train/samples_per_sec` | every `log_every_n_steps` steps" in text
    assert "`train/samples_per_sec` itself, at every step" not in text
