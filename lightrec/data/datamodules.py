"""LightningDataModules over the lightrec datasets, sharded by rank.

Every DataModule yields whole :class:`~lightrec.data.Batch` objects (``DataLoader(batch_size=None)``)
and shards batch indices over ranks with :class:`~lightrec.data.RankBatchSampler`: rank and world
size come from the attached trainer, else from ``torch.distributed``, else ``(0, 1)``.
``batch_size`` is per rank; ``num_*_batches`` / the data are global, so ``W`` ranks run
``num_batches // W`` steps each and together see the same samples as one rank.
"""

from __future__ import annotations

import abc
import functools
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightrec.data.criteo.memmap_dataset import CriteoMemmapDataset, load_criteo_meta
from lightrec.data.criteo.preprocess import preprocess_criteo
from lightrec.data.criteo.spec import table_configs
from lightrec.data.errors import DatasetNotFoundError, OnError, check_on_error
from lightrec.data.movielens.dataset import MovieLensDataset
from lightrec.data.movielens.reader import MovieLensData, detect_variant, read_movielens
from lightrec.data.rank_sampling import rank_dataloader, resolve_rank
from lightrec.data.synthetic.criteo import SyntheticCriteoDataset
from lightrec.data.synthetic.movielens import synthetic_movielens
from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

__all__ = ["CRITEO_KAGGLE_URL", "CriteoDataModule", "MovieLensDataModule", "SyntheticCriteo"]

CRITEO_KAGGLE_URL = "https://go.criteo.net/criteo-research-kaggle-display-advertising-challenge-dataset.tar.gz"
"""The Criteo Kaggle display-advertising data (``train.txt``); the 1TB click logs come from Criteo AI Lab."""


class _RankedDataModule(pl.LightningDataModule, abc.ABC):
    """Shared loader construction: rank-aware sampler, workers, pinning.

    ``pin_memory=None`` (the default) pins the loaders' batches when the attached trainer trains
    on a CUDA device, so that ``Batch.to`` copies them asynchronously (see :class:`Batch`).
    """

    def __init__(
        self, num_workers: int, pin_memory: bool | None, shuffle: bool, seed: int, persistent_workers: bool
    ) -> None:
        super().__init__()
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            # checked here, not when the first loader is built: that is on every rank, after they started
            raise ValueError(f"num_workers must be an int >= 0 (0: load in the training process), got {num_workers!r}")
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.shuffle = shuffle
        self.seed = seed
        self.persistent_workers = persistent_workers

    def rank_and_world_size(self) -> tuple[int, int]:
        """``(rank, world_size)`` this DataModule shards for."""
        return resolve_rank(self.trainer)

    def pins_memory(self) -> bool:
        """Whether the loaders pin batches: ``pin_memory``, or for None, whether training runs on CUDA."""
        if self.pin_memory is not None:
            return self.pin_memory
        device = self.trainer_device()
        return device is not None and device.type == "cuda"

    def trainer_device(self) -> torch.device | None:
        """The attached trainer's root device, or None (no trainer, or one without a strategy)."""
        return getattr(getattr(self.trainer, "strategy", None), "root_device", None)

    @abc.abstractmethod
    def dataset(self, split: str) -> Dataset:
        """The dataset of ``split`` (``"train"``, ``"val"``, ``"test"``): item ``i`` is whole batch ``i``."""

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("train"), self.shuffle)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("val"), False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("test"), False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("test"), False)

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        rank, world = self.rank_and_world_size()
        return rank_dataloader(
            dataset,  # type: ignore[arg-type]
            rank=rank,
            world_size=world,
            shuffle=shuffle,
            seed=self.seed,
            num_workers=self.num_workers,
            pin_memory=self.pins_memory(),
            persistent_workers=self.persistent_workers,
        )


class SyntheticCriteo(_RankedDataModule):
    """The default data of every recipe: synthetic Criteo-like clicks with a known best AUC.

    Args:
        batch_size: samples per batch per rank.
        num_train_batches / num_val_batches / num_test_batches: batches per split (all ranks together).
        seed: fixes the hidden model and every sample.
        cardinalities: ``"kaggle"``, ``"1tb"`` or 26 ints.
        scale / num_embeddings_cap: shrink the tables (``scale`` first, then the cap).
        zipf_exponent / ids_per_feature / ids_distribution / dense_signal / sparse_signal / base_ctr:
            see :class:`~lightrec.data.PlantedCriteoModel`.
        block_size: samples per generator seed (default ``batch_size``); keep it fixed to compare
            runs with different per-rank batch sizes sample for sample.
        device: draw the batches with torch on this device instead of numpy on the host (e.g.
            ``"cuda"``: the batch is made where it is consumed; no copy, no pinning). ``"auto"``
            uses the attached trainer's device (each rank its own GPU). See ``SyntheticCriteoDataset``.
        shuffle: shuffle the order of training batches every epoch.
        num_workers / pin_memory / persistent_workers: ``DataLoader`` settings (``pin_memory=None``:
            pin when training on CUDA and the batches are drawn on the host).
        vocabulary: ``"fixed"`` or ``"drifting"``: raw 63-bit ids of vocabularies that drift, for
            tables behind managed collisions (``RecModule(managed_collisions=...)``); validation and
            test batches come from the time after the training stream. See ``SyntheticCriteoDataset``.
        drift_per_batch: with ``"drifting"``, the share of each feature's live ids replaced per
            batch (e.g. 0.02 over 400 batches: about 9 vocabularies pass through each table).
    """

    def __init__(
        self,
        batch_size: int = 512,
        num_train_batches: int = 400,
        num_val_batches: int = 20,
        num_test_batches: int = 40,
        seed: int = 0,
        cardinalities: str | list[int] = "kaggle",
        scale: float = 1.0,
        num_embeddings_cap: int | None = 100_000,
        zipf_exponent: float = 1.1,
        ids_per_feature: int | list[int] = 1,
        ids_distribution: Literal["fixed", "poisson"] = "fixed",
        dense_signal: float = 0.8,
        sparse_signal: float = 1.6,
        base_ctr: float = 0.25,
        block_size: int | None = None,
        device: str | None = None,
        shuffle: bool = False,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        vocabulary: Literal["fixed", "drifting"] = "fixed",
        drift_per_batch: float = 0.02,
    ) -> None:
        super().__init__(num_workers, pin_memory, shuffle, seed, persistent_workers)
        if vocabulary == "drifting" and shuffle:
            raise ValueError(
                "SyntheticCriteo(vocabulary='drifting') is a stream in time: shuffling its batches mixes past and "
                "future ids; use shuffle=False"
            )
        if vocabulary == "drifting" and device is not None:
            raise ValueError(f"SyntheticCriteo(vocabulary='drifting') draws batches on the host; use device=None, got {device!r}")
        if device is not None and device != "auto" and torch.device(device).type == "cuda" and num_workers > 0:
            raise ValueError(
                f"SyntheticCriteo(device={device!r}) draws batches on the GPU in the main process; "
                f"use num_workers=0, got {num_workers}"
            )
        self.save_hyperparameters()
        self.device = device
        make = functools.partial(
            SyntheticCriteoDataset, batch_size=batch_size, seed=seed, cardinalities=cardinalities, scale=scale,
            num_embeddings_cap=num_embeddings_cap, block_size=block_size, zipf_exponent=zipf_exponent,
            ids_per_feature=ids_per_feature, ids_distribution=ids_distribution, dense_signal=dense_signal,
            sparse_signal=sparse_signal, base_ctr=base_ctr, vocabulary=vocabulary, drift_per_batch=drift_per_batch,
        )  # fmt: skip
        later = num_train_batches if vocabulary == "drifting" else 0  # evaluation after the training stream
        # Building the datasets is cheap (no data is generated until a batch is read).
        self.datasets = {
            "train": make(num_batches=num_train_batches, split="train"),
            "val": make(num_batches=num_val_batches, split="val", time_offset_batches=later),
            "test": make(num_batches=num_test_batches, split="test", time_offset_batches=later),
        }
        self._bayes_auc: float | None = None
        self._place_datasets(None if device == "auto" else device)

    def _place_datasets(self, device: str | torch.device | None) -> None:
        for dataset in self.datasets.values():
            dataset.device = torch.device(device) if device is not None else None
            dataset._sampler = None

    def setup(self, stage: str | None = None) -> None:
        if self.device == "auto":  # the attached trainer's device, known once Lightning set it up
            device = self.trainer_device()
            if device is not None and device.type == "cuda" and self.num_workers > 0:
                raise ValueError(
                    f"SyntheticCriteo(device='auto') draws batches on {device} in the main process; "
                    f"use num_workers=0, got {self.num_workers}"
                )
            self._place_datasets(device)

    def pins_memory(self) -> bool:
        # Batches drawn on a device are already there: nothing to pin.
        return self.datasets["train"].device is None and super().pins_memory()

    @property
    def num_embeddings_per_feature(self) -> list[int]:
        return self.datasets["train"].num_embeddings_per_feature

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One ``EmbeddingBagConfig`` per categorical feature (``t_cat_i`` over ``["cat_i"]``)."""
        return self.datasets["train"].table_configs(embedding_dim)

    def bayes_optimal_auc(self) -> float:
        """Best AUC any model can reach on this data (computed once, ~1 s)."""
        if self._bayes_auc is None:
            self._bayes_auc = self.datasets["train"].bayes_optimal_auc()
        return self._bayes_auc

    def dataset(self, split: str) -> SyntheticCriteoDataset:
        return self.datasets[split]


class CriteoDataModule(_RankedDataModule):
    """Criteo Kaggle / 1TB data preprocessed by :func:`~lightrec.data.preprocess_criteo`.

    Args:
        data_dir: the preprocessed folder.
        batch_size: samples per batch per rank.
        raw_inputs: Criteo TSV files; when given, ``prepare_data`` preprocesses them into
            ``data_dir`` first (on one process per node; resumes an interrupted run).
        preprocess_kwargs: extra arguments of ``preprocess_criteo`` (``num_embeddings_cap``,
            ``min_count``, ``on_error``, ...).
        train_parts / val_parts / test_parts: part names (input file names without suffix) per split.
            Without any, the rows of all parts are split in time order by the fractions below. When
            ``val_parts == test_parts`` those rows are halved: first half val, second half test
            (the usual ``day_23`` split of the 1TB data).
        val_fraction / test_fraction: tail fractions for the default split.
        shuffle: shuffle training batch order every epoch.
    """

    def __init__(
        self,
        data_dir: str,
        batch_size: int = 2048,
        raw_inputs: list[str] | None = None,
        preprocess_kwargs: dict[str, Any] | None = None,
        train_parts: list[str] | None = None,
        val_parts: list[str] | None = None,
        test_parts: list[str] | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(num_workers, pin_memory, shuffle, seed, persistent_workers)
        if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
            raise ValueError(
                f"val_fraction and test_fraction must be >= 0 and sum to < 1, got {val_fraction!r}, {test_fraction!r}"
            )
        self.save_hyperparameters()
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.raw_inputs = raw_inputs
        self.preprocess_kwargs = dict(preprocess_kwargs or {})
        self.parts = {"train": train_parts, "val": val_parts, "test": test_parts}
        self.fractions = (val_fraction, test_fraction)
        self.datasets: dict[str, CriteoMemmapDataset] = {}

    def check_data(self) -> None:
        """Raise ``DatasetNotFoundError`` (with the download URL) when there is nothing to read.

        Cheap (file names only): ``data_dir`` must hold a finished preprocess (``meta.json``), or
        every ``raw_inputs`` file must exist for ``prepare_data`` to preprocess. ``lightrec run``
        calls it before starting any rank.
        """
        missing = [p for p in self.raw_inputs or [] if not Path(p).is_file()]
        if self.raw_inputs and not missing:
            return
        if not self.raw_inputs and (Path(self.data_dir) / "meta.json").is_file():
            return
        what = (
            f"raw_inputs {missing} do not exist."
            if missing
            else f"{self.data_dir!r} holds no preprocessed Criteo data (meta.json)."
        )
        raise DatasetNotFoundError(
            self.data_dir,
            what,
            CRITEO_KAGGLE_URL,
            "unpack train.txt, then pass --data.init_args.raw_inputs '[path/to/train.txt]' to preprocess "
            "it on the first run, or run lightrec.data.preprocess_criteo; the default dlrm config needs no data",
        )

    def prepare_data(self) -> None:
        if self.raw_inputs:
            preprocess_criteo(self.raw_inputs, self.data_dir, **self.preprocess_kwargs)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        b, d = self.batch_size, self.data_dir
        if all(p is None for p in self.parts.values()):
            v, t = self.fractions
            bounds = {"train": (0.0, 1.0 - v - t), "val": (1.0 - v - t, 1.0 - t), "test": (1.0 - t, 1.0)}
            self.datasets = {s: CriteoMemmapDataset(d, b, row_range=r) for s, r in bounds.items()}
            return
        shared = self.parts["val"] is not None and self.parts["val"] == self.parts["test"]
        for split, parts in self.parts.items():
            if parts is None:
                self.datasets[split] = CriteoMemmapDataset(d, b, parts=[], row_range=None)
            elif shared and split in ("val", "test"):
                self.datasets[split] = CriteoMemmapDataset(
                    d, b, parts=parts, row_range=(0.0, 0.5) if split == "val" else (0.5, 1.0)
                )
            else:
                self.datasets[split] = CriteoMemmapDataset(d, b, parts=parts)

    @property
    def num_embeddings_per_feature(self) -> list[int]:
        return list(load_criteo_meta(self.data_dir)["num_embeddings_per_feature"])

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One ``EmbeddingBagConfig`` per categorical feature, sized by the preprocessing."""
        return table_configs(embedding_dim, self.num_embeddings_per_feature)

    def dataset(self, split: str) -> CriteoMemmapDataset:
        self.setup()
        return self.datasets[split]


class MovieLensDataModule(_RankedDataModule):
    """MovieLens batches for click prediction (``task="ctr"``) or retrieval (``task="retrieval"``).

    Without ``data_dir`` the data is :func:`~lightrec.data.synthetic.synthetic_movielens` (ml-100k's shape,
    a planted preference signal, no download); with it, a real release read from disk
    (``https://files.grouplens.org/datasets/movielens/ml-100k.zip``, unzipped).

    Training batches are reshuffled row by row every epoch (``shuffle``); validation and test keep
    every row (a last partial batch is shared out, see ``MovieLensDataset(cover_all=True)``).

    Args:
        data_dir: unpacked ml-100k / ml-1m / ml-20m / ml-25m folder; ``None``: the synthetic set.
        task: ``"ctr"``: every rating, label ``rating >= label_threshold``; ``"retrieval"``: only
            ratings ``>= label_threshold`` (positive user→item pairs, label = the rating), meant
            for in-batch negatives.
        batch_size: samples per batch per rank.
        split: ``"random"`` (seeded permutation of the ratings) or ``"time"`` (oldest ratings train,
            newest test).
        val_fraction / test_fraction: share of ratings in val / test.
        on_error: ``"raise"`` or ``"skip"`` malformed lines (see ``read_movielens``).
        pooling: ``"SUM"`` or ``"MEAN"`` pooling of the tables (matters for multi-hot ``genres``).
        synthetic_size: ``(users, movies, ratings)`` of the synthetic set (without ``data_dir``).
    """

    def __init__(
        self,
        data_dir: str | None = None,
        task: Literal["ctr", "retrieval"] = "ctr",
        batch_size: int = 1024,
        split: Literal["random", "time"] = "random",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        label_threshold: float = 4.0,
        on_error: OnError = "raise",
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        pooling: Literal["SUM", "MEAN"] = "SUM",
        synthetic_size: tuple[int, int, int] = (943, 1682, 100_000),
    ) -> None:
        super().__init__(num_workers, pin_memory, shuffle, seed, persistent_workers)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if pooling not in ("SUM", "MEAN"):
            raise ValueError(f"pooling must be 'SUM' or 'MEAN', got {pooling!r}")
        if task not in ("ctr", "retrieval"):
            raise ValueError(f"task must be 'ctr' or 'retrieval', got {task!r}")
        if split not in ("random", "time"):
            raise ValueError(f"split must be 'random' or 'time', got {split!r}")
        if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
            raise ValueError(
                f"val_fraction and test_fraction must be >= 0 and sum to < 1, got {val_fraction!r}, {test_fraction!r}"
            )
        self.save_hyperparameters()
        self.data_dir, self.task, self.batch_size, self.split = data_dir, task, batch_size, split
        self.fractions = (val_fraction, test_fraction)
        self.label_threshold = label_threshold
        self.on_error = check_on_error(on_error)
        self.pooling = PoolingType(pooling)
        self.synthetic_size = tuple(synthetic_size)
        self.data: MovieLensData | None = None
        self.datasets: dict[str, MovieLensDataset] = {}
        self._ranks = 0  # the world size the datasets were cut for

    def check_data(self) -> None:
        """Raise ``DatasetNotFoundError`` (with the download URL) if ``data_dir`` holds no release.

        Cheap (looks at file names only); ``lightrec run`` calls it before starting any rank.
        """
        if self.data_dir is not None:
            detect_variant(self.data_dir)

    def _read(self) -> MovieLensData:
        if self.data_dir is None:
            users, movies, ratings = self.synthetic_size
            return synthetic_movielens(users, movies, ratings, seed=self.seed)
        return read_movielens(self.data_dir, on_error=self.on_error)

    def setup(self, stage: str | None = None) -> None:
        ranks = self.rank_and_world_size()[1]
        # The evaluation splits are cut for the world size: datasets built before the trainer was
        # attached (``table_configs`` for the model) are cut again for its ranks.
        if self.datasets and self._ranks == ranks:
            return
        data = self.data if self.data is not None else self._read()
        rows = np.arange(len(data))
        if self.task == "retrieval":
            rows = rows[data.rating[rows] >= self.label_threshold]
        if self.split == "random":
            rows = rows[np.random.default_rng(self.seed).permutation(len(rows))]
        else:
            rows = rows[np.argsort(data.timestamp[rows], kind="stable")]
        n, (v, t) = len(rows), self.fractions
        a, b = int(round(n * (1 - v - t))), int(round(n * (1 - t)))
        threshold = None if self.task == "retrieval" else self.label_threshold
        self.data = data
        make = functools.partial(MovieLensDataset, label_threshold=threshold, pooling=self.pooling)
        self._ranks = ranks
        shuffle_seed = self.seed if self.shuffle else None
        self.datasets = {
            "train": make(data, rows[:a], self.batch_size, shuffle_seed=shuffle_seed),
            "val": make(data, rows[a:b], self.batch_size, cover_all=True, ranks=ranks),
            "test": make(data, rows[b:], self.batch_size, cover_all=True, ranks=ranks),
        }

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One table per sparse feature, sized from the data (reads it if needed)."""
        self.setup()
        return self.datasets["train"].table_configs(embedding_dim)

    def dataset(self, split: str) -> MovieLensDataset:
        self.setup()
        return self.datasets[split]
