"""DataModules: rank resolution (trainer, real gloo ranks), Lightning integration, Criteo splits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from lightrec.data import Batch, SyntheticCriteo, SyntheticCriteoDataset, preprocess_criteo
from lightrec.data.datamodules import CriteoDataModule
from tests.data._rank_bodies import read_synthetic
from tests.data.criteo.test_criteo import _expected, _row, _write
from tests.multiprocess import run_ranks

SMALL = dict(num_embeddings_cap=500)


def test_real_gloo_ranks_read_disjoint_batches() -> None:
    results = run_ranks(read_synthetic, world_size=2)
    assert [r["rank"] for r in results] == [(0, 2), (1, 2)]
    assert results[0]["indices"] == [0, 2, 4] and results[1]["indices"] == [1, 3, 5]  # batch 6 dropped
    ref = SyntheticCriteoDataset(batch_size=8, num_batches=7, **SMALL)
    for r in results:
        assert r["ids"] == [int(ref[i].sparse_features.values()[0]) for i in r["indices"]]


def test_rank_from_attached_trainer_wins() -> None:
    dm = SyntheticCriteo(batch_size=8, num_train_batches=9, **SMALL)
    assert dm.rank_and_world_size() == (0, 1)
    dm.trainer = SimpleNamespace(global_rank=2, world_size=3)  # type: ignore[assignment]
    loader = dm.train_dataloader()
    assert list(loader.sampler) == [2, 5, 8]
    assert isinstance(loader.sampler, DistributedSampler)  # Lightning keeps it instead of re-sharding


def test_datamodule_exposes_tables_and_bayes_auc() -> None:
    dm = SyntheticCriteo(batch_size=8, cardinalities="1tb", num_embeddings_cap=1000)
    cfgs = dm.table_configs(32)
    assert (
        len(cfgs) == 26
        and cfgs[0].name == "t_cat_0"
        and cfgs[0].num_embeddings == 1000
        and cfgs[5].num_embeddings == 3
    )
    assert dm.num_embeddings_per_feature[5] == 3
    auc = dm.bayes_optimal_auc()
    assert 0.7 < auc < 0.95 and dm.bayes_optimal_auc() == auc
    assert dm.hparams["batch_size"] == 8


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(13, 1)
        self.seen: list[int] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, Batch)
        self.seen.append(int(batch.sparse_features.values()[0]))
        logits = self.lin(batch.dense_features).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_reads_batches_in_order(tmp_path: Path) -> None:
    dm = SyntheticCriteo(batch_size=16, num_train_batches=4, shuffle=True, **SMALL)
    model = _Tiny()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    ds = dm.datasets["train"]
    g = torch.Generator()
    expected = []
    for epoch in range(2):  # Lightning called set_epoch: a new order each epoch
        g.manual_seed(epoch)
        expected += [int(ds[i].sparse_features.values()[0]) for i in torch.randperm(4, generator=g).tolist()]
    assert model.seen == expected


@pytest.fixture
def criteo_raw(tmp_path: Path) -> tuple[list[Path], list[list[list[str]]]]:
    rng = np.random.default_rng(3)
    days = [[_row(rng, i) for i in range(40)] for _ in range(3)]
    paths = []
    for d, rows in enumerate(days):
        _write(tmp_path / f"day_{d}", rows)
        paths.append(tmp_path / f"day_{d}")
    return paths, days


def test_criteo_datamodule_fraction_split(criteo_raw, tmp_path: Path) -> None:  # noqa: ANN001
    paths, days = criteo_raw
    dm = CriteoDataModule(
        str(tmp_path / "out"), batch_size=6, raw_inputs=[str(p) for p in paths],
        preprocess_kwargs={"num_embeddings_cap": 1000, "progress": False}, val_fraction=0.25, test_fraction=0.25, shuffle=False,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [10, 5, 5]  # 60 / 30 / 30 rows
    _, dense, _ = _expected([r for day in days for r in day])
    first_test = next(iter(dm.test_dataloader()))
    np.testing.assert_allclose(first_test.dense_features.numpy(), dense[90:96], rtol=1e-6)
    assert dm.table_configs(4)[0].num_embeddings == 1000
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2)  # type: ignore[assignment]
    assert list(dm.train_dataloader().sampler) == [1, 3, 5, 7, 9]


def test_criteo_datamodule_named_parts(criteo_raw, tmp_path: Path) -> None:  # noqa: ANN001
    paths, days = criteo_raw
    preprocess_criteo(paths, tmp_path / "out", num_embeddings_cap=1000, progress=False)
    dm = CriteoDataModule(
        str(tmp_path / "out"),
        batch_size=10,
        train_parts=["day_0", "day_1"],
        val_parts=["day_2"],
        test_parts=["day_2"],
    )
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [8, 2, 2]
    labels, _, _ = _expected(days[2])
    np.testing.assert_array_equal(
        dm.datasets["test"][0].labels.numpy(), labels[20:30]
    )  # second half of day_2
    with pytest.raises(ValueError, match="val_fraction and test_fraction"):
        CriteoDataModule(str(tmp_path / "out"), val_fraction=0.6, test_fraction=0.5)
