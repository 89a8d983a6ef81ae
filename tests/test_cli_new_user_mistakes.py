"""More mistakes a new user makes with ``lightrec run`` (issue 23): one line, exit 2, before any rank starts.

Each of these used to start the ranks and stop every one of them with a traceback (up to 156 lines,
exit 1), end the run early without an error (exit 0), or silently ignore an option:

* a recipe pointed at the wrong kind of data: ``two_tower`` on click data ("candidate_feature_names
  names unknown features" on every rank), ``dlrm`` on MovieLens ("dense_in_features must be a
  positive int, got 0" on every rank);
* tables given with ``--model.tables`` whose feature the data lacks (missing-feature error at the
  first batch);
* fewer batches than ranks (``Trainer.fit stopped: No training batches``, exit 0, test metrics of
  an untrained model);
* ``--accelerator gpu`` on a CPU machine ("No supported gpu backend found!", traceback);
* ``--data.init_args.num_workers -1`` (a traceback from every rank's first loader);
* a wrong type in a config file or on the command line showed the expected type but not the value;
* ``--ckpt_path`` of another recipe's checkpoint (LightningCLI's 79-line usage), a ``--model.*``
  option that differs from the checkpoint's model (LightningCLI silently took the checkpoint's
  value), and a sharded checkpoint resumed with ``--trainer.strategy auto`` ("Is a directory").

Resumed with another number of ranks, the run goes on with a warning naming the batch size that
keeps the global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightrec.cli import main
from tests.reliability.checkpoint_files import save_folder

MISTAKES = [
    (["two_tower", "--data.class_path", "lightrec.data.SyntheticCriteo"],
     "the two_tower recipe trains on (user, item) pairs and needs a retrieval DataModule"),
    (["dlrm", "--data.class_path", "lightrec.data.MovieLensDataModule"],
     "the dlrm recipe needs dense (continuous) features for DLRM's bottom MLP, but the data has dense_in_features=0"),
    (["dlrm", "--model.tables", '[{"name": "t", "num_embeddings": 10, "feature_names": ["nope"]}]'],
     "table 't' of --model.tables reads features ['nope'] that SyntheticCriteo does not have; its features are "
     "['cat_0', 'cat_1',"),
    (["dlrm", "--devices", "2", "--data.init_args.num_train_batches", "1"],
     "the train data has 1 batch(es), fewer than the 2 ranks: every rank needs at least one of it"),
    (["dlrm", "--data.init_args.num_workers", "-1"], "num_workers must be an int >= 0 (0: load in the training process), got -1"),
    (["dlrm", "--trainer.max_epochs", "two"], "--trainer.max_epochs: Expected a <class 'int'>, got 'two'"),
]  # fmt: skip


def _one_line(capfd: pytest.CaptureFixture[str]) -> str:
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), MISTAKES, ids=[" ".join(a[:3]) for a, _ in MISTAKES])
def test_mistakes_are_one_line_before_any_rank_starts(
    args: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", *args]) == 2
    assert expected in _one_line(capfd)
    assert not list(tmp_path.iterdir())  # nothing ran


def test_a_wrong_type_in_a_config_file_names_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "my.yaml"
    assert main(["cp", "dlrm", str(config)]) == 0
    capfd.readouterr()
    config.write_text(config.read_text().replace("embedding_dim: 16", "embedding_dim: sixteen"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "dlrm", "-c", str(config)]) == 2
    line = _one_line(capfd)
    assert "--model.embedding_dim: Expected a <class 'int'>" in line and "sixteen" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_gpu_accelerator_without_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "dlrm", "--accelerator", "gpu", "--devices", "1"]) == 2
    line = _one_line(capfd)
    assert "--accelerator gpu but torch" in line and "sees no CUDA device on this machine; use --accelerator cpu" in line


def _recipe_checkpoint(path: Path, module: str, embedding_dim: int = 16) -> Path:
    """A plain-file checkpoint as a one-device recipe run writes it (only what the checks read)."""
    torch.save(
        {"lightrec_module": module, "hyper_parameters": {"embedding_dim": embedding_dim, "dense_lr": 0.05},
         "datamodule_hyper_parameters": {"batch_size": 1024}, "state_dict": {}},
        path,
    )  # fmt: skip
    return path


def test_resume_mistakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    dlrm = _recipe_checkpoint(tmp_path / "dlrm.ckpt", "lightrec.recipes.dlrm.DLRMModule")
    assert main(["run", "two_tower", "--ckpt_path", str(dlrm)]) == 2
    assert _one_line(capfd) == (
        f"error: --ckpt_path '{dlrm}' was written by lightrec.recipes.dlrm.DLRMModule, not by this recipe's "
        "TwoTowerModule: resume it with the recipe that wrote it (lightrec run <that recipe> --ckpt_path ...)"
    )
    assert main(["run", "dlrm", "--model.embedding_dim", "8", "--ckpt_path", str(dlrm)]) == 2
    assert "--model.embedding_dim 8 differs from the checkpoint's embedding_dim=16: a resumed run keeps" in _one_line(capfd)
    sharded = tmp_path / "last.ckpt"
    save_folder(sharded, step=2)
    assert main(["run", "dlrm", "--devices", "1", "--trainer.strategy", "auto", "--ckpt_path", str(sharded)]) == 2
    assert "is a sharded checkpoint folder, which only the lightrec strategy reads" in _one_line(capfd)


def test_resuming_on_another_number_of_ranks_warns_with_the_batch_size_to_keep(tmp_path: Path) -> None:
    """The run goes on; the warning says how to keep the global batch (the data position is in samples)."""
    from lightrec.lightning.recipe.checks import RecipeArgumentError, _build
    from lightrec.lightning.recipe.cli import RecipeCLI
    from lightrec.lightning.recipe.preflight import check_built_run
    from lightrec.recipes import CONFIGS_DIR
    from lightrec.recipes.dlrm import DLRMModule

    sharded = tmp_path / "last.ckpt"
    save_folder(sharded, step=2, extra={"datamodule_hyper_parameters": {"batch_size": 1024}})

    cli = _build(RecipeCLI, DLRMModule, ["--config", str(CONFIGS_DIR / "dlrm.yaml"), "--trainer.devices", "2"])
    notes = check_built_run(cli, [], str(sharded), RecipeArgumentError)  # saved by 1 rank, resumed on 2
    assert notes == [
        "warning: the checkpoint was trained on 1 rank(s) x batch_size 1024 (a global batch of 1024); this run has "
        "2 x 1024 (2048): the rest of the epoch is the same samples in steps of another size; to train as before "
        "pass --data.init_args.batch_size 512"
    ]
    cli = _build(RecipeCLI, DLRMModule, ["--config", str(CONFIGS_DIR / "dlrm.yaml"), "--trainer.devices", "1"])
    assert check_built_run(cli, [], str(sharded), RecipeArgumentError) == []  # the same global batch: no warning


def test_a_saved_runs_config_passes_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``config.yaml`` a run saves holds the fit subcommand's ``ckpt_path`` / ``weights_only``;
    ``lightrec run dlrm -c <it>`` used to stop at "Option 'ckpt_path' is not accepted"."""
    from lightrec.lightning.recipe.checks import check_recipe_args
    from lightrec.lightning.recipe.cli import RecipeCLI
    from recipes import dlrm

    config = tmp_path / "config.yaml"
    assert main(["cp", "dlrm", str(config)]) == 0
    config.write_text(config.read_text() + "\nckpt_path: null\nweights_only: null\n")
    monkeypatch.chdir(tmp_path)
    configs = Path(dlrm.__file__).resolve().parent / "configs"
    requested = check_recipe_args(RecipeCLI, dlrm.DLRMModule, ["fit", "--config", str(config)], configs)
    assert requested is not None and requested.accelerator == "cpu"
