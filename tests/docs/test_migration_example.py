"""docs/examples/torchrec_dlrm_migrated.py (the worked example of docs/migrating-from-torchrec.md)
trains on 2 gloo ranks with per-step losses equal to lightrec's own RecStrategy path on the same
data and plan, and every import it uses is torchrec's path with the word replaced."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "torchrec_dlrm_migrated.py"
STEPS = 12


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torchrec_dlrm_migrated", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(rank: int, world_size: int) -> dict:
    result = _script().train(steps=STEPS)
    result["plan"] = result["plan"].to_json()
    return result


def _rec_strategy(rank: int, world_size: int, port: int, plan_json: str, tmp: str) -> list[float]:
    """The same model, data, plan, optimizers and communication through Trainer + RecStrategy."""
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch

    from lightrec.distributed.types import ShardingPlan
    from lightrec.lightning import RecModule, RecStrategy

    script = _script()

    class DLRMModule(RecModule):
        def table_configs(self) -> list:
            return script.build_model(torch.device("meta")).model.sparse_arch.embedding_bag_collection.embedding_bag_configs()

        def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
            torch.manual_seed(0)
            return script.DLRM(embedding_bag_collection=embedding_bag_collection, dense_in_features=13,
                               dense_arch_layer_sizes=[32, script.EMBEDDING_DIM], over_arch_layer_sizes=[32, 1])  # fmt: skip

        def forward(self, dense: torch.Tensor, sparse: object) -> torch.Tensor:
            return self.model(dense, sparse)

        def train_dataloader(self) -> object:
            return script.get_dataloader(self.trainer.global_rank, STEPS)

    losses: list[float] = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    # The script's plan has the DMP-wrapped DLRMTrain's paths (model.sparse_arch...), the same as RecModule's.
    strategy = RecStrategy(plan=ShardingPlan.from_json(plan_json), sharders=script.sharders_with_qcomms())
    trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy, max_steps=STEPS, max_epochs=1,
                         num_sanity_val_steps=0, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Record()], default_root_dir=tmp)  # fmt: skip
    module = DLRMModule(dense_optimizer="adagrad", dense_lr=script.LEARNING_RATE, embedding_optimizer="rowwise_adagrad",
                        embedding_lr=script.LEARNING_RATE, embedding_eps=1e-8, metrics=("auc",))  # fmt: skip
    trainer.fit(module)
    return losses


@pytest.mark.slow  # the migrated script and RecStrategy, each a 2-rank fit: ~36 s on 2 shared cores
def test_migrated_dlrm_script_matches_rec_strategy(tmp_path: Path) -> None:
    scripted = run_ranks(_train, world_size=2, timeout=300)
    assert scripted[0]["plan"] == scripted[1]["plan"]
    lightning = run_ranks(_rec_strategy, world_size=2, args=(free_port(), scripted[0]["plan"], str(tmp_path)), timeout=300)
    for rank in range(2):
        losses = scripted[rank]["losses"]
        assert len(losses) == STEPS
        assert losses == pytest.approx(lightning[rank], rel=1e-5, abs=1e-6), rank
        assert sum(losses[-3:]) < sum(losses[:3])  # it learns (one batch per rank, repeated)
        metrics = scripted[rank]["metrics"]
        assert 0.5 < metrics["auc-click|lifetime_auc"] <= 1.0 and metrics["throughput-throughput|total_examples"] == STEPS * 128
    assert "table_wise" in scripted[0]["plan"] or "row_wise" in scripted[0]["plan"]


def lightrec_imports(script: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``from lightrec... import ...`` of ``script``."""
    tree = ast.parse(script.read_text())
    return [(node.module, [a.name for a in node.names]) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lightrec"]  # fmt: skip


def check_torchrec_paths(script: Path) -> None:
    """Every lightrec import of ``script`` is a torchrec path (and name) mirrored under lightrec
    (the tables of tests/test_torchrec_paths.py and, for managed collisions, of
    tests/modules/managed_collision/test_mc_torchrec_paths.py)."""
    from tests.modules.managed_collision.test_mc_torchrec_paths import MC_PATHS
    from tests.test_torchrec_paths import TORCHREC_PATHS

    mirrored: dict[str, set[str]] = {}
    for table in (TORCHREC_PATHS, MC_PATHS):
        for path, names in table.items():
            mirrored.setdefault(path, set()).update(names)
    for module, imported in lightrec_imports(script):
        path = module.replace("lightrec", "torchrec", 1)
        assert path in mirrored, f"{script.name} imports {module}, which is not a mirrored torchrec path"
        missing = [n for n in imported if n not in mirrored[path]]
        assert not missing, f"{path} in TORCHREC_PATHS / MC_PATHS lacks {missing}"


def test_migrated_script_imports_are_torchrec_paths() -> None:
    assert len(lightrec_imports(SCRIPT)) >= 15
    check_torchrec_paths(SCRIPT)
