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
        checkpoint = dict(next(c["init_args"] for c in callbacks if c["class_path"].endswith("ModelCheckpoint")))
        checkpoint.pop("every_n_train_steps", None)  # dlrm_online: its one last.ckpt is rewritten as it goes
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


def test_ci_installs_exactly_as_the_readme_says() -> None:
    """Issue 16, item 3: the README's CPU install takes torch from PyTorch's CPU index (PyPI's Linux
    wheel is the CUDA build), and `.ci/run` runs the same commands."""
    root = DOCS.parent
    readme = (root / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") :].split("```bash", 1)[1].split("```", 1)[0]
    readme_installs = [
        line.strip() for line in quick_start.splitlines() if line.strip().startswith("pip install")
    ]
    assert readme_installs == [
        "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu",
        'pip install -e ".[cpu,dev]"',
    ]
    ci_installs = [
        line.strip().replace("python -m pip install -q ", "pip install ")
        for line in (root / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith("python -m pip install -q")
        and "upgrade pip" not in line
        and "triton" not in line
    ]
    assert ci_installs == readme_installs
    assert "192 MB" in readme and "several GB" in readme  # the download sizes are stated
    assert (
        "pip install torch==2.13.0 fbgemm-gpu==1.8.0 --index-url https://download.pytorch.org/whl/cu126"
        in readme
    )
