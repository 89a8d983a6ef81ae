"""``ParquetDataModule``: your own event logs (Parquet files, folders, partitions) as training batches.

::

    from lightrec.data import ParquetDataModule

    data = ParquetDataModule(
        "s3://logs/clicks/",                      # a file, folder (hive partitions), glob or URI
        label="click",
        dense=["price", "age"],                    # nulls -> dense_fill
        sparse={"user": "user_id", "item": {"column": "item_id", "num_embeddings": 1_000_000,
                "id_mapping": "hash"}, "tags": {"column": "tag_ids", "weights": "tag_scores"}},
        batch_size=2048, num_workers=2, val={"day": "2024-01-07"},
    )
    trainer.fit(model, datamodule=data)          # model tables: data.table_configs(embedding_dim)

or from the command line: ``lightrec run dlrm --data parquet --data.path logs/ --data.label click``.

What it does, and where each part lives (all in :mod:`lightrec.data.parquet`):

* **files** (``source``): the path's files in path order, each footer read once;
* **features** (``spec``): ``sparse`` as a list of columns, a dict of options, or ``"auto"``;
  ``dense`` a list or ``"auto"``; table sizes declared, from the column statistics, or for raw ids
  (``sizing``): :meth:`table_configs`;
* **splits** (``splits``): ``val`` / ``test`` by file, partition value or fraction; without them
  every row is training data, read once per epoch;
* **ranks and workers** (``sharding``): disjoint rows, the same steps on every rank, batches that do
  not depend on ``num_workers``; ``shuffle`` permutes row groups and the rows of
  ``shuffle_window`` row groups together, per epoch;
* **resume** (``state``): the training loader's position is in every checkpoint, and a resumed run
  trains on exactly the batches the uninterrupted one would have;
* **following** (``follow``): ``follow=True`` keeps reading new files as they land;
* **bad data** (``errors``): typed errors naming file, row group, column, row and value;
  ``on_error="skip"`` leaves bad rows out, counts them, logs the count (``data/skipped_rows`` in
  TensorBoard, and a warning) -- nothing is skipped silently.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightrec._stop_signal import sigterm_noted
from lightrec.data.errors import OnError, check_on_error
from lightrec.data.parquet.follow import FollowingParquetLoader, FollowOptions, WaitsForData, following_source
from lightrec.data.parquet.loader import LoaderBase, LoaderOptions, ParquetLoader
from lightrec.data.parquet.ranks import RankDataMismatchError, agree_on_files, distributed
from lightrec.data.parquet.sizing import size_tables
from lightrec.data.parquet.source import FileStamp, ParquetSource
from lightrec.data.parquet.spec import (
    FeatureOptions,
    FeatureSpec,
    IdMapping,
    NullIds,
    build_spec,
    check_schema,
)
from lightrec.data.parquet.splits import (
    SplitSetting,
    check_follow_splits,
    held_out,
    split_paths,
    split_slices,
)
from lightrec.data.rank_sampling import resolve_rank
from lightrec.modules.embedding_configs import EmbeddingBagConfig

__all__ = ["ParquetDataModule"]

SparseSetting = list[str] | dict[str, str | dict[str, Any]] | Literal["auto"]


class ParquetDataModule(pl.LightningDataModule):
    """Batches of a Parquet source for every rank (module docstring).

    Args:
        path: a file, a folder (read recursively; hive partitions), a glob, a URI, or a list of them.
        label: the label column (a number or bool).
        dense: dense columns (``Batch.dense_features`` in this order; glob patterns allowed), or
            ``"auto"`` (every floating-point column but the label; integer counts must be listed).
        sparse: id columns: a list (feature = column), a dict ``{feature: column or {column, weights,
            num_embeddings, id_mapping, pooling, nulls}}``, or ``"auto"`` (every integer and list of
            integer column that is neither label nor dense).
        batch_size: samples per batch per rank.
        num_workers: loader processes per rank (0: read in the training process).
        val / test: the splits: a path or glob (or a list), a dict of partition values, or a fraction.
        num_embeddings / id_mapping / nulls / pooling: defaults for every sparse feature (a dict
            entry of ``sparse`` overrides them): see :class:`~lightrec.data.parquet.spec.SparseFeature`.
        dense_fill: the value of a null or NaN dense entry.
        dense_transform: ``"none"`` or ``"log1p"`` (``log(1 + max(x, 0))``, Criteo's counts).
        binary_label: labels must be 0 or 1 (binary cross-entropy); False for other targets.
        shuffle / shuffle_window / seed: shuffle the training data per epoch (row groups, and the rows
            of every ``shuffle_window`` row groups together: the shuffle buffer).
        on_error: ``"raise"`` at the first bad row, or ``"skip"`` bad rows (counted and logged).
        follow / poll_interval / idle_timeout / marker: read new files as they land (training data;
            see :mod:`lightrec.data.parquet.follow`). Files that ``val`` or ``test`` select, there at
            the start or landing later, are left out of it; fractions are refused with ``follow``.
            ``marker`` holds back the files of unmarked folders, those there at the start too; a start
            with no (complete) file waits for the first, up to ``idle_timeout`` seconds.
        pin_memory: build batches in page-locked memory; None: when training on CUDA.
        prefetch_factor: parts (of ~32k rows) each worker lays out ahead.
        persistent_workers: keep each loader's workers across epochs (started once; an epoch
            abandoned midway restarts them). A following loader starts its workers per round.
        task: what the rows are for. ``"ctr"``: labelled impressions (dlrm, deepfm). ``"retrieval"``:
            each row is a positive (query, candidate) pair, e.g. a click with the user's and the
            item's id columns, trained with in-batch negatives (the two_tower recipe: its
            ``candidate_feature_names`` pick the candidate tower's features, the rest feed the query
            tower); rows whose label is > 0 count as queries in recall@k, so write only the pairs to
            learn from (filter clicks before writing) or keep a 0 label on rows that must not count.
    """

    def __init__(
        self,
        path: str | list[str],
        label: str = "label",
        dense: list[str] | Literal["auto"] = "auto",
        sparse: SparseSetting = "auto",
        batch_size: int = 1024,
        num_workers: int = 0,
        val: SplitSetting = None,
        test: SplitSetting = None,
        num_embeddings: int | None = None,
        id_mapping: IdMapping = "none",
        nulls: NullIds = "error",
        pooling: Literal["SUM", "MEAN"] = "SUM",
        dense_fill: float = 0.0,
        dense_transform: Literal["none", "log1p"] = "none",
        binary_label: bool = True,
        shuffle: bool = False,
        shuffle_window: int = 1,
        seed: int = 0,
        on_error: OnError = "raise",
        follow: bool = False,
        poll_interval: float = 10.0,
        idle_timeout: float | None = 600.0,
        marker: str | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
        persistent_workers: bool = True,
        task: Literal["ctr", "retrieval"] = "ctr",
    ) -> None:
        super().__init__()
        if task not in ("ctr", "retrieval"):
            raise ValueError(f"task must be 'ctr' (labelled impressions) or 'retrieval' ((query, candidate) pairs), got {task!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0: read in the training process), got {num_workers!r}")
        if follow and shuffle:
            raise ValueError("follow=True reads files in the order they land; shuffle=True would mix that order: pick one")
        if follow:  # refused now, not when the loaders are made: a fraction of a growing folder is not fixed
            check_follow_splits(val, test)
        self.save_hyperparameters()
        self.path, self.label, self.batch_size, self.num_workers = path, label, batch_size, num_workers
        self.task = task
        self.dense: list[str] | Literal["auto"] = list(dense) if isinstance(dense, (list, tuple)) else dense
        self.sparse = sparse
        self.splits = {"val": val, "test": test}
        self.feature_options = FeatureOptions(
            num_embeddings=num_embeddings, id_mapping=id_mapping, nulls=nulls, pooling=pooling,
            dense_fill=dense_fill, dense_transform=dense_transform, binary_label=binary_label,
        )  # fmt: skip
        self.shuffle, self.shuffle_window, self.seed = shuffle, shuffle_window, seed
        self.on_error = check_on_error(on_error)
        self.follow = FollowOptions(poll_interval, idle_timeout, marker) if follow else None
        self.pin_memory, self.prefetch_factor = pin_memory, prefetch_factor
        self.persistent_workers = persistent_workers
        self._source: ParquetSource | None = None
        self._spec: FeatureSpec | None = None
        self._sized: FeatureSpec | None = None
        # the default group the ranks agreed on the files under (weakly; None: not yet): once per group
        self._agreed_under: weakref.ReferenceType[dist.ProcessGroup] | None = None

    # ------------------------------------------------------------------ the data
    @property
    def source(self) -> ParquetSource:
        """The files (listed and their footers read at first use); with ``follow``, the complete ones, or the
        first to land (:func:`~lightrec.data.parquet.follow.following_source`)."""
        if self._source is None:
            paths = [self.path] if isinstance(self.path, str) else list(self.path)
            extra = [p for v in self.splits.values() for p in split_paths(v)]
            listed = list(dict.fromkeys(paths + extra))
            # val / test paths are fixed selections: the marker that gates the followed folder does not apply
            unmarked = [p for p in extra if p not in paths]
            self._source = (
                ParquetSource(listed) if self.follow is None else following_source(listed, self.follow, unmarked=unmarked)
            )
        return self._source

    @property
    def spec(self) -> FeatureSpec:
        """The feature spec (not sized yet: see :meth:`sized_spec`)."""
        if self._spec is None:
            self._spec = self._spec_of(self.source)
        return self._spec

    def _spec_of(self, source: ParquetSource) -> FeatureSpec:
        first = source.files[0]
        spec = build_spec(first.schema, first.path, self.label, self.dense, self.sparse, **self.feature_options)
        for info in source.files[1:]:  # every file must give the same features (footers only)
            check_schema(spec, info.schema, info.path, first=(first.schema, first.path))
        return spec

    def sized_spec(self) -> FeatureSpec:
        """The feature spec with every table's size (declared or from the data's statistics)."""
        if self._sized is None:
            self._sized = size_tables(self.source, self.spec)
        return self._sized

    @property
    def num_dense_features(self) -> int:
        """Columns of ``Batch.dense_features`` (the recipes link it into the model)."""
        return len(self.spec.dense)

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One ``EmbeddingBagConfig`` per sparse feature, ``t_<feature>``, sized from the data or as declared."""
        return self.sized_spec().table_configs(embedding_dim)

    def check_data(self) -> None:
        """Raise early (before ranks start) when the path has no Parquet files or lacks a column.

        ``lightrec run`` calls it; it lists the files and reads their footers, no rows. With ``follow``, an
        empty path (or one without a marked folder) is waited for, up to ``idle_timeout`` seconds.

        Raises:
            FileNotFoundError: no (complete) Parquet file at the path (with ``follow``: none landed in time).
            ParquetSchemaError / ParquetFileError: a column is missing or mistyped, a file unreadable.
        """
        self.spec  # noqa: B018 - builds the source and the spec, which check the files and columns

    # ------------------------------------------------------------------ ranks
    def setup(self, stage: str) -> None:
        """Every rank takes rank 0's files (:meth:`agree_on_ranks`); Lightning calls it on every rank."""
        self.agree_on_ranks()

    def agree_on_ranks(self) -> None:
        """Make rank 0's listing of the files every rank's (:mod:`~lightrec.data.parquet.ranks`): a file that
        landed while the ranks started is otherwise in some ranks' listings only (different steps per rank,
        a hang; tables sized differently). Once per default process group; a collective of every rank when
        ``torch.distributed`` runs more than one and this DataModule's trainer spans them all (``setup`` and the
        first loader call it). Nothing without ``torch.distributed``, or for a trainer of one process beside a
        larger world (e.g. ``Trainer(devices=1).validate(...)`` on rank 0 after a fit): it reads its own listing.

        Raises:
            RankDataMismatchError (on every rank): this rank had sized its tables from a listing that rank 0's
                changes (the model was built before the ranks agreed: declare ``num_embeddings``, or let the
                recipe size the tables inside the fit), or a rank could not list or read the files. Nothing
                changes then: a second call raises again.
            ValueError: the trainer spans more than one process but not every rank of the world.
        """
        world = dist.group.WORLD if distributed() else None
        if world is None:
            return
        if self._agreed_under is not None and self._agreed_under() is world:
            return
        _, ranks = self._rank()
        if ranks == 1:
            return
        if ranks != dist.get_world_size():
            raise ValueError(
                f"this DataModule's trainer runs {ranks} processes in a torch.distributed world of "
                f"{dist.get_world_size()}: its ranks read rank 0's files, which needs every rank of the world "
                "(run the trainer on all of them, or on one process)"
            )
        agree_on_files(lambda: self.source.stamps(), self._take_files)
        self._agreed_under = weakref.ref(world)

    def _take_files(self, stamps: list[FileStamp]) -> None:
        """Rank 0's files as this rank's; refused (nothing changed) where tables sized from its own listing change."""
        source = self.source.with_files(stamps)
        spec = self._spec_of(source)
        sized = None
        if self._sized is not None:
            sized = size_tables(source, spec)
            changed = [
                f"{f.name} {f.num_embeddings} -> {g.num_embeddings}"
                for f, g in zip(self._sized.sparse, sized.sparse)
                if f.num_embeddings != g.num_embeddings
            ]
            if changed:
                raise RankDataMismatchError(
                    f"this rank sized tables from the data before the ranks agreed on rank 0's files (files landed "
                    f"while the ranks started), and rank 0's files size them otherwise: {', '.join(changed)} rows. "
                    "Declare num_embeddings for these features, or size the tables inside the fit (a recipe's "
                    "RecipeModule does, after the DataModule's setup) instead of calling table_configs() before "
                    "trainer.fit"
                )
        self._source, self._spec, self._sized = source, spec, sized

    # ------------------------------------------------------------------ loaders
    def _rank(self) -> tuple[int, int]:
        return resolve_rank(self.trainer)

    def _pins(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        strategy = self.trainer.strategy if self.trainer is not None else None
        return strategy is not None and strategy.root_device.type == "cuda"

    def _options(self, name: str) -> LoaderOptions:
        return dict(
            num_workers=self.num_workers, on_error=self.on_error, pin_memory=self._pins(),
            prefetch_factor=self.prefetch_factor, name=name, persistent_workers=self.persistent_workers,
        )  # fmt: skip

    def _loader(self, split: str) -> LoaderBase:
        self.agree_on_ranks()  # where no Trainer ran setup
        rank, world = self._rank()
        spec, source = self.sized_spec(), self.source
        if split == "train" and self.follow is not None:
            loader: LoaderBase = FollowingParquetLoader(
                # val / test files stay out of the followed stream, also those that land later
                # (fractions were refused when the DataModule was made: not checked again)
                source, spec, self.batch_size, self.follow, held_out(**self.splits, check=False), rank=rank,
                world_size=world, **self._options(split),
            )  # fmt: skip
        else:
            slices = split_slices(source, **self.splits)[split]
            shuffle = self.shuffle and split == "train"
            loader = ParquetLoader(
                source, spec, slices, self.batch_size, rank, world, shuffle=shuffle, seed=self.seed,
                shuffle_window=self.shuffle_window, **self._options(split),
            )  # fmt: skip
        loader.on_skip = lambda count: self._log_skipped(split, count)
        if isinstance(loader, FollowingParquetLoader):
            loader.stop_waiting = self._received_sigterm  # a stopped job must not wait for files (follow.py, 4.)
            loader.on_stop = self._sigterm_stop
            loader.on_wait = self._data_wait
        return loader

    def _received_sigterm(self) -> bool:
        # RecStrategy's handler only notes the signal (the ranks agree on it at a batch start, and none starts
        # while the loader waits); Lightning's own sets trainer.received_sigterm in the handler.
        return self.trainer is not None and (self.trainer.received_sigterm or sigterm_noted())

    @staticmethod
    def _sigterm_stop() -> None:
        """Stop as Lightning does on SIGTERM (its loops raise this at a batch end), from inside the wait for
        files: the epoch is left unfinished, so a checkpoint taken at the stop resumes the stream."""
        raise SIGTERMException

    def _data_wait(self) -> None:
        """The trainer's :class:`WaitsForData` callbacks, while the followed folder has no new file (every rank)."""
        trainer = self.trainer
        if trainer is None or not trainer.training or trainer.lightning_module is None:
            return
        callbacks: list[object] = getattr(trainer, "callbacks", [])  # set by Lightning's connector, undeclared
        for callback in callbacks:
            if isinstance(callback, WaitsForData):
                callback.on_data_wait(trainer, trainer.lightning_module)

    def _log_skipped(self, split: str, count: int) -> None:
        trainer = self.trainer
        if trainer is None or trainer.logger is None:
            return
        trainer.logger.log_metrics({f"data/{split}_skipped_rows": float(count)}, step=trainer.global_step)

    def _has(self, split: str) -> bool:
        return self.splits[split] is not None

    def train_dataloader(self) -> LoaderBase:
        return self._loader("train")

    def val_dataloader(self) -> LoaderBase | list[LoaderBase]:
        return self._loader("val") if self._has("val") else []

    def test_dataloader(self) -> LoaderBase | list[LoaderBase]:
        return self._loader("test") if self._has("test") else []

    def predict_dataloader(self) -> LoaderBase | list[LoaderBase]:
        return self.test_dataloader()

    def describe(self) -> Mapping[str, object]:
        """Files, rows and features, for logs."""
        return {**self.source.describe(), "label": self.spec.label, "dense": list(self.spec.dense), "sparse": self.spec.keys}

