"""Every shipped recipe config loads and trains a few steps in-process (strategy auto, one device)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from lightrec.lightning.recipe.cli import fabric_run_overrides, resolve_config_args, with_launcher_overrides
from lightrec.recipes import CONFIGS, CONFIGS_DIR, RECIPES, config_path, configs_of

# Tiny sizes: a few steps, one val and two test batches, small tables.
COMMON = [
    "--trainer.devices=1",
    "--trainer.strategy=auto",
    "--trainer.max_steps=3",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=2",
    "--trainer.val_check_interval=1.0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def parquet_of(criteo_dir: Path) -> Path:
    """The session's tiny Criteo ``train.txt`` converted to Parquet (once)."""
    from lightrec.data.parquet.convert import convert_to_parquet

    out = criteo_dir.parent / "parquet"
    if not out.is_dir():
        convert_to_parquet(criteo_dir.parent / "train.txt", out, row_group_size=64, progress=False)
    return out


def data_args(config: str, criteo_dir: Path, movielens_dir: Path) -> list[str]:
    if config == "dlrm_parquet":
        return [f"--data.init_args.path={parquet_of(criteo_dir)}", "--data.init_args.batch_size=32",
                "--data.init_args.num_workers=0", "--data.init_args.num_embeddings=200", "--data.init_args.val=0.2",
                "--data.init_args.test=0.2"]  # fmt: skip
    if config in ("dlrm", "dlrm_dcn", "dlrm_managed"):
        return ["--data.init_args.num_embeddings_cap=300", "--data.init_args.batch_size=64"]
    if config.endswith("criteo"):
        return [f"--data.init_args.data_dir={criteo_dir}", "--data.init_args.batch_size=32",
                "--data.init_args.num_workers=0", "--model.warmup_steps=0", "--data.init_args.val_fraction=0.2",
                "--data.init_args.test_fraction=0.2"]  # fmt: skip
    return [f"--data.init_args.data_dir={movielens_dir}", "--data.init_args.batch_size=32"]


def run_config(config: str, tmp_path: Path, criteo_dir: Path, movielens_dir: Path, extra: list[str] = ()):  # noqa: ANN201
    module = importlib.import_module(f"lightrec.recipes.{CONFIGS[config]}")
    args = ["fit", "--config", config, *COMMON, f"--trainer.logger.init_args.save_dir={tmp_path}"]
    return module.main(args + data_args(config, criteo_dir, movielens_dir) + list(extra))


def test_registry_matches_the_config_files() -> None:
    assert sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")) == sorted(CONFIGS)
    for recipe in RECIPES.values():
        assert recipe.path.is_file()
        assert recipe.default_config in configs_of(recipe.script)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_config_header_gives_the_command(config: str) -> None:
    header = [line for line in config_path(config).read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header)
    assert f"python recipes/{CONFIGS[config]}.py fit --config recipes/configs/{config}.yaml" in text
    assert f"recipes/{CONFIGS[config]}.py fit --config recipes/configs/{config}.yaml" in text.split("torchrun")[-1]
    assert re.search(r"lightrec run \w+", text), text


def test_fabric_run_flags_become_trainer_overrides() -> None:
    """`fabric run --accelerator cpu --devices 1 recipes/dlrm.py` sets LT_* variables only Fabric reads;
    the recipe takes them as overrides placed after its configs and before the user's options."""
    environ = {"LT_CLI_USED": "1", "LT_ACCELERATOR": "cpu", "LT_DEVICES": "1", "LT_NUM_NODES": "1", "LT_STRATEGY": "ddp"}
    overrides = fabric_run_overrides(environ)
    assert overrides == ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1"]
    assert fabric_run_overrides({"LT_DEVICES": "2"}) == []  # not under fabric run
    args = ["fit", "--config", "a.yaml", "--config=b.yaml", "--trainer.devices=2"]
    assert with_launcher_overrides(args, overrides) == [
        "fit", "--config", "a.yaml", "--config=b.yaml", *overrides, "--trainer.devices=2",
    ]  # fmt: skip
    assert with_launcher_overrides(["--help"], overrides) == ["--help"]


def test_resolve_config_args(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("{}")
    assert resolve_config_args([], tmp_path, "a.yaml") == ["fit", "--config", str(tmp_path / "a.yaml")]
    assert resolve_config_args(["test", "--config", "a"], tmp_path, "x.yaml") == [
        "test",
        "--config",
        str(tmp_path / "a.yaml"),
    ]
    assert resolve_config_args(["--config=a.yaml"], tmp_path, "x.yaml") == [
        "fit",
        f"--config={tmp_path / 'a.yaml'}",
    ]
    # Unknown names and real paths are passed through for LightningCLI to judge.
    assert resolve_config_args(["fit", "--config", "nope"], tmp_path, "x.yaml") == ["fit", "--config", "nope"]


@pytest.mark.parametrize("config", sorted(c for c in CONFIGS if c != "dlrm_online"))  # online: test_online.py
def test_config_trains_a_few_steps(
    config: str, tmp_path: Path, criteo_dir: Path, movielens_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = run_config(config, tmp_path, criteo_dir, movielens_dir)
    trainer, model = cli.trainer, cli.model
    assert trainer.global_step == 3
    tested = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
    expected = "test/recall@10" if CONFIGS[config] == "two_tower" else "test/auc"
    assert expected in tested and 0.0 <= tested[expected] <= 1.0
    out = capsys.readouterr().out
    assert f"{expected[5:]}={tested[expected]:.4f}" in out  # the printed summary shows the logged value
    log_dir = Path(trainer.logger.log_dir)
    assert f"TensorBoard logs: {log_dir}" in out and list(log_dir.glob("events.out.tfevents.*"))
    last = log_dir / "checkpoints" / "last.ckpt"
    assert last.is_file() and f"{last}" in out
    # The linked tables are the DataModule's, with the model's width.
    assert [t.num_embeddings for t in model.table_configs()] == [
        t.num_embeddings for t in cli.datamodule.table_configs(model.embedding_dim)
    ]
    if config in ("dlrm", "dlrm_dcn", "dlrm_managed"):
        bayes = cli.datamodule.bayes_optimal_auc()
        gap = (tested["test/auc"] - 0.5) / (bayes - 0.5)
        assert f"Bayes-optimal AUC of the synthetic data: {bayes:.4f}" in out and f"{gap:.1%}" in out


@pytest.mark.parametrize(("config", "run_metric"), [("two_tower_movielens", "val/recall@10"), ("dlrm", "val/auc")])
def test_hp_metric_is_the_validation_metric_runs_are_compared_by(
    config: str, run_metric: str, tmp_path: Path, criteo_dir: Path, movielens_dir: Path
) -> None:
    """TensorBoard's HPARAMS tab compares runs by hp_metric: the validation AUC, recall@k for two_tower
    (which logged none: the tab showed Lightning's -1 placeholder)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = run_config(config, tmp_path, criteo_dir, movielens_dir,
                     ["--trainer.val_check_interval=3", "--recipe.test_after_fit=false"])  # fmt: skip
    events = EventAccumulator(str(cli.trainer.logger.log_dir)).Reload()
    assert events.Scalars("hp_metric")[-1].value == pytest.approx(events.Scalars(run_metric)[-1].value)
    assert events.Scalars("hp_metric")[-1].value != -1


def test_checkpoint_rebuilds_the_model_for_serving(
    tmp_path: Path, criteo_dir: Path, movielens_dir: Path
) -> None:
    cli = run_config("dlrm_dcn", tmp_path, criteo_dir, movielens_dir, ["--recipe.test_after_fit=false"])
    last = Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["lightrec_module"] == "lightrec.recipes.dlrm.DLRMModule"
    from lightrec.recipes.dlrm import DLRMModule

    restored = DLRMModule.load_from_checkpoint(last, map_location="cpu")
    assert restored.interaction == "dcn" and restored.tables == cli.model.tables
    batch = next(iter(cli.datamodule.test_dataloader()))
    trained = cli.model.eval()
    with torch.no_grad():
        expected = trained(batch.dense_features, batch.sparse_features)
        # Fused tables after load_from_checkpoint, and the plain-EBC serving copy, score identically.
        torch.testing.assert_close(restored.eval()(batch.dense_features, batch.sparse_features), expected)
        serving = restored.serving_model()
        torch.testing.assert_close(serving(batch.dense_features, batch.sparse_features), expected)
    from lightrec.modules import EmbeddingBagCollection

    assert isinstance(serving.sparse_arch.embedding_bag_collection, EmbeddingBagCollection)


def test_sharded_model_is_built_on_meta_with_the_fused_optimizer_mark() -> None:
    from lightrec.optim import EmbOptimType, fused_spec_from_parameter
    from lightrec.recipes.deepfm import DeepFMModule

    tables = [{"name": "t_a", "num_embeddings": 10**9, "feature_names": ["a"]},
              {"name": "t_b", "num_embeddings": 7, "feature_names": ["b"]}]  # fmt: skip
    module = DeepFMModule(tables=tables, embedding_dim=8, embedding_lr=0.3)
    model = module.model_for_planning()  # a billion-row table costs nothing on meta
    weights = dict(model.sparse_arch.embedding_bag_collection.named_parameters())
    assert all(w.is_meta for w in weights.values())
    spec = fused_spec_from_parameter(weights["embedding_bags.t_a.weight"])
    assert spec.optimizer == EmbOptimType.ROWWISE_ADAGRAD and spec.learning_rate == 0.3
    assert module.fused_params()["learning_rate"] == 0.3


def test_bad_model_arguments_are_named() -> None:
    from lightrec.recipes.dlrm import DLRMModule

    with pytest.raises(ValueError, match="embedding_optimizer must be one of"):
        DLRMModule(embedding_optimizer="lamb")
    with pytest.raises(ValueError, match="interaction must be 'dot' or 'dcn', got 'cross'"):
        DLRMModule(interaction="cross")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no tables"):
        DLRMModule().configure_model()
    with pytest.raises(ValueError, match=r"model.tables\[0\] must be a dict"):
        DLRMModule(tables=[{"name": "t"}]).configure_model()


def test_two_tower_trains_behind_managed_collisions(tmp_path: Path, criteo_dir: Path, movielens_dir: Path) -> None:
    from lightrec.modules.managed_collision import ManagedCollisionEmbeddingBagCollection

    extra = ['--model.managed_collisions={"eviction_interval": 2, "eviction_policy": "lfu"}']
    cli = run_config("two_tower_movielens", tmp_path, criteo_dir, movielens_dir, extra)
    collection = cli.model.built_model().two_tower.ebc
    assert isinstance(collection, ManagedCollisionEmbeddingBagCollection)
    stats = [m.mc_stats() for m in collection._managed_collision_collection.modules_by_table().values()]
    assert sum(s["inserted"] for s in stats) > 0
    assert 0.0 <= float(cli.trainer.callback_metrics["test/recall@10"]) <= 1.0
    assert cli.model.hparams["managed_collisions"] == {"eviction_interval": 2, "eviction_policy": "lfu"}
