"""DataModules as a Lightning user relies on them: ranks, workers, epochs, world size, bad seeds."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from lightrec.data import MovieLensDataModule, SyntheticCriteo, SyntheticCriteoDataset
from lightrec.data.synthetic import PlantedCriteoModel, synthetic_movielens
from tests.multiprocess import free_port, run_ranks, set_torchrun_env

SMALL: dict[str, Any] = {"num_embeddings_cap": 300}


def _epoch_batches(num_workers: int, persistent_workers: bool, epochs: int = 3) -> list[list[np.ndarray]]:
    dm = MovieLensDataModule(
        batch_size=64,
        synthetic_size=(50, 80, 2000),
        num_workers=num_workers,
        persistent_workers=persistent_workers,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)  # what Lightning does before each epoch
        out.append([b.sparse_features.values().numpy().copy() for b in loader])
    return out


@pytest.mark.slow  # worker or rank processes started several times: ~10 s
def test_persistent_workers_reshuffle_rows_every_epoch_like_the_main_process() -> None:
    """MovieLensDataset reshuffles its rows in set_epoch; persistent workers kept epoch 0's rows."""
    reference = _epoch_batches(0, False)
    for got in (_epoch_batches(2, False), _epoch_batches(2, True)):
        assert len(got) == len(reference)
        for ref_epoch, got_epoch in zip(reference, got, strict=True):
            assert len(ref_epoch) == len(got_epoch)
            for a, b in zip(ref_epoch, got_epoch, strict=True):
                np.testing.assert_array_equal(a, b)


def test_movielens_eval_splits_are_cut_for_the_trainer_ranks_after_table_configs() -> None:
    """table_configs() before the fit (to build the model) set the splits up for 1 rank; 2 ranks then
    dropped a batch of validation rows (5 batches: 2 steps each) instead of scoring every row."""
    dm = MovieLensDataModule(batch_size=64, synthetic_size=(50, 80, 3000), shuffle=False)
    dm.table_configs(8)  # no trainer yet: 1 rank
    rows = {"val": 0, "test": 0}
    steps = []
    for rank in range(2):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        dm.setup("fit")
        for split, loader in (("val", dm.val_dataloader()), ("test", dm.test_dataloader())):
            batches = list(loader)
            steps.append(len(batches))
            rows[split] += sum(b.batch_size for b in batches)
    assert (
        rows
        == {"val": len(dm.datasets["val"].rows), "test": len(dm.datasets["test"].rows)}
        == {"val": 300, "test": 300}
    )
    assert steps[0] == steps[2] and steps[1] == steps[3]  # same steps on both ranks


@pytest.mark.parametrize("seed", [-1, 1 << 64, 1.5])
def test_a_bad_seed_is_refused_naming_it(seed: Any) -> None:
    with pytest.raises(ValueError, match="seed must be an int"):
        SyntheticCriteo(batch_size=4, seed=seed, **SMALL)
    with pytest.raises(ValueError, match="seed must be an int"):
        PlantedCriteoModel(seed, [10] * 26)
    if seed != 1 << 64:
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            synthetic_movielens(10, 10, 100, seed=seed)


def test_large_and_numpy_seeds_still_work() -> None:
    a = SyntheticCriteoDataset(batch_size=4, num_batches=1, seed=np.int64(7), **SMALL)[0]
    b = SyntheticCriteoDataset(batch_size=4, num_batches=1, seed=7, **SMALL)[0]
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    SyntheticCriteoDataset(batch_size=4, num_batches=1, seed=(1 << 48) - 1, **SMALL)[0]


# --- Trainer(devices=2, strategy="ddp") on real gloo ranks -----------------------------------------


def _ddp_fit(rank: int, world_size: int, port: int, root: str) -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl

    class Record(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(13, 1)
            self.seen: dict[str, list[float]] = {"train": [], "val": []}

        def _key(self, batch: Any) -> float:
            return float(batch.dense_features[0, 0])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.seen["train"].append(self._key(batch))
            return self.lin(batch.dense_features).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.seen["val"].append(self._key(batch))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    out: dict[str, Any] = {}
    for name, limit in (("all", 1.0), ("limit 2", 2)):
        module = Record()
        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, strategy="ddp", max_epochs=1, limit_train_batches=limit,
            limit_val_batches=limit, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=os.path.join(root, name),
        )  # fmt: skip
        data = SyntheticCriteo(batch_size=4, num_train_batches=7, num_val_batches=5, **SMALL)
        trainer.fit(module, datamodule=data)
        out[name] = module.seen
    return out


@pytest.mark.slow  # worker or rank processes started several times: ~10 s
def test_two_lightning_ranks_read_disjoint_batches_whose_union_is_the_one_rank_data(tmp_path: Any) -> None:
    results = run_ranks(_ddp_fit, 2, args=(free_port(), str(tmp_path)), timeout=300)
    reference = SyntheticCriteo(batch_size=4, num_train_batches=7, num_val_batches=5, **SMALL)
    keys = {
        split: [float(reference.dataset(split)[i].dense_features[0, 0]) for i in range(n)]
        for split, n in (("train", 7), ("val", 5))
    }
    for name, steps in (("all", {"train": 3, "val": 2}), ("limit 2", {"train": 2, "val": 2})):
        for split, n in steps.items():
            per_rank = [r[name][split] for r in results]
            assert [len(p) for p in per_rank] == [n, n], (name, split)  # equal counts: no rank waits
            # step t of rank r reads global batch t * 2 + r: the first 2n batches of one rank's order
            assert per_rank[0] == keys[split][0 : 2 * n : 2] and per_rank[1] == keys[split][1 : 2 * n : 2], (
                name,
                split,
            )
