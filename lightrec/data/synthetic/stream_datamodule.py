"""``SyntheticStream``: the drifting synthetic clicks as an unbounded training stream (online training).

The online recipe's default data (``lightrec run dlrm_online``)::

    from lightrec.data import SyntheticStream

    data = SyntheticStream(batch_size=512, num_embeddings_cap=20_000, drift_per_batch=0.02)
    trainer = pl.Trainer(max_steps=1000, ...)            # the stream has no end: max_steps ends the fit
    trainer.fit(model, datamodule=data)                  # tables: data.table_configs(dim), managed collisions

Batch ``i`` of the stream is batch ``i`` of the training split of
:class:`~lightrec.data.SyntheticCriteo` with the same settings (the same samples, the same raw
63-bit ids alive at that time), read in order by every rank (:mod:`lightrec.data.synthetic.stream`);
the position is in every checkpoint, so a resumed fit trains on the batches the uninterrupted one
would have. There is no validation or test split: score the stream itself before training on each
batch (``lightrec.lightning.ProgressiveValidation``).
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch

from lightrec.data.criteo.spec import INT_FEATURE_COUNT
from lightrec.data.rank_sampling import resolve_rank
from lightrec.data.synthetic.criteo import SyntheticCriteoDataset
from lightrec.data.synthetic.stream import UNBOUNDED_BATCHES, SyntheticStreamLoader, stream_fingerprint
from lightrec.modules.embedding_configs import EmbeddingBagConfig

__all__ = ["SyntheticStream"]

# Settings that do not change which samples the stream holds (left out of its fingerprint). The batch
# size does not with the fixed vocabulary; a drifting one drifts ``drift_per_batch`` per batch, so its
# fingerprint holds the drift per sample instead (``births_per_sample``).
_NOT_SAMPLES = ("batch_size", "block_size", "max_batches", "num_workers", "pin_memory", "prefetch_factor")


class SyntheticStream(pl.LightningDataModule):
    """An unbounded stream of synthetic Criteo-like clicks, by default over a drifting vocabulary.

    Args:
        batch_size: samples per batch per rank.
        seed: fixes the hidden model and every sample.
        cardinalities / scale / num_embeddings_cap: the tables (see ``SyntheticCriteo``); with the
            drifting vocabulary each feature keeps ``n_f`` ids alive, and its table ``n_f`` rows
            sits behind managed collisions.
        vocabulary: ``"drifting"`` (raw 63-bit ids born and retired as the stream goes; the default)
            or ``"fixed"`` (ids ``[0, n_f)``, a stationary stream).
        drift_per_batch: with ``"drifting"``, the share of each feature's live ids replaced per batch
            of ``batch_size`` samples (so the ids depend on ``drift_per_batch / batch_size``).
        max_batches: end the stream after this many global batches (all ranks); None: never (a
            Trainer's ``max_steps`` ends the fit).
        zipf_exponent / ids_per_feature / ids_distribution / dense_signal / sparse_signal / base_ctr:
            the planted model (:class:`~lightrec.data.PlantedCriteoModel`).
        block_size: samples per generator seed (default ``batch_size``); keep it fixed to resume or
            compare runs with other per-rank batch sizes sample for sample (with the drifting
            vocabulary, scale ``drift_per_batch`` with the batch size too: a checkpoint of another
            drift per sample is refused).
        num_workers: loader processes per rank (0: batches are made in the training process).
        pin_memory: pin batches; None: when the trainer trains on CUDA.
        prefetch_factor: batches each worker makes ahead.
    """

    def __init__(
        self,
        batch_size: int = 512,
        seed: int = 0,
        cardinalities: str | list[int] = "kaggle",
        scale: float = 1.0,
        num_embeddings_cap: int | None = 20_000,
        vocabulary: Literal["fixed", "drifting"] = "drifting",
        drift_per_batch: float = 0.02,
        max_batches: int | None = None,
        zipf_exponent: float = 1.1,
        ids_per_feature: int | list[int] = 1,
        ids_distribution: Literal["fixed", "poisson"] = "fixed",
        dense_signal: float = 0.8,
        sparse_signal: float = 1.6,
        base_ctr: float = 0.25,
        block_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
    ) -> None:
        super().__init__()
        if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1):
            raise ValueError(f"max_batches must be None (an unbounded stream) or an int >= 1, got {max_batches!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0: make batches in the training process), got {num_workers!r}")
        self.save_hyperparameters()
        self.num_workers, self.pin_memory, self.prefetch_factor = num_workers, pin_memory, prefetch_factor
        self.dataset = SyntheticCriteoDataset(
            batch_size=batch_size, num_batches=max_batches or UNBOUNDED_BATCHES, split="train", seed=seed,
            cardinalities=cardinalities, scale=scale, num_embeddings_cap=num_embeddings_cap, block_size=block_size,
            vocabulary=vocabulary, drift_per_batch=drift_per_batch, zipf_exponent=zipf_exponent,
            ids_per_feature=ids_per_feature, ids_distribution=ids_distribution, dense_signal=dense_signal,
            sparse_signal=sparse_signal, base_ctr=base_ctr,
        )  # fmt: skip
        settings = {k: v for k, v in self.hparams.items() if k not in _NOT_SAMPLES}
        settings["block_size"] = self.dataset.block_size
        drifting = self.dataset.model.vocabulary
        if drifting is not None:  # the ids drift drift_per_batch * n_f / batch_size per sample: fingerprint that
            del settings["drift_per_batch"]
            settings["births_per_sample"] = drifting.rates
        self.fingerprint = stream_fingerprint(settings)
        self._bayes_auc: float | None = None

    @property
    def num_dense_features(self) -> int:
        """Dense features per sample (13, Criteo's counts)."""
        return INT_FEATURE_COUNT

    @property
    def num_embeddings_per_feature(self) -> list[int]:
        return self.dataset.num_embeddings_per_feature

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One ``EmbeddingBagConfig`` per categorical feature (``t_cat_i`` over ``["cat_i"]``)."""
        return self.dataset.table_configs(embedding_dim)

    def bayes_optimal_auc(self) -> float:
        """Best AUC any model can reach on this data (computed once, ~1 s; the drift does not change it)."""
        if self._bayes_auc is None:
            self._bayes_auc = self.dataset.bayes_optimal_auc()
        return self._bayes_auc

    def train_dataloader(self) -> SyntheticStreamLoader:
        rank, world_size = resolve_rank(self.trainer)
        return SyntheticStreamLoader(
            self.dataset, rank, world_size, num_workers=self.num_workers, pin_memory=self._pins_memory(),
            prefetch_factor=self.prefetch_factor, fingerprint=self.fingerprint,
        )  # fmt: skip

    def _pins_memory(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        device: object = getattr(getattr(self.trainer, "strategy", None), "root_device", None)
        return isinstance(device, torch.device) and device.type == "cuda"
