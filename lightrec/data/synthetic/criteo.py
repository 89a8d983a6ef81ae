"""Synthetic Criteo-like batches: :class:`SyntheticCriteoDataset` over the planted model.

The samples come from :class:`~lightrec.data.PlantedCriteoModel` (:mod:`lightrec.data.synthetic.planted`:
the hidden logistic model, its known Bayes-optimal AUC, the drifting vocabulary), drawn with numpy
on the host or with torch on a device (:mod:`lightrec.data.synthetic.device`).

Determinism: samples are generated in blocks of ``block_size`` samples; block ``k`` of split ``s``
has its own generator seeded by ``(seed, s, k)``. A batch is ``batch_size / block_size`` consecutive
blocks, so a batch depends only on ``(seed, split, batch index)`` — not on workers, ranks or order —
and two ranks' batches of size ``B`` at one step equal one batch of size ``2B`` on one rank. With
``vocabulary="drifting"`` that takes the same drift per sample too: the ids drift ``drift_per_batch``
per batch of ``batch_size``, so batch ``2B`` needs ``2 * drift_per_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from lightrec.data.batch import Batch
from lightrec.data.criteo.spec import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    resolve_cardinalities,
    table_configs,
)
from lightrec.data.errors import check_at_least
from lightrec.data.synthetic.device import TorchPlantedSampler
from lightrec.data.synthetic.drifting import DriftingVocabulary
from lightrec.data.synthetic.planted import PlantedCriteoModel, SampleBlock, sigmoid, split_code
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["SyntheticCriteoDataset"]


class SyntheticCriteoDataset(Dataset):
    """Map-style dataset whose item ``i`` is the whole :class:`Batch` number ``i`` of a split.

    Read it with ``DataLoader(ds, batch_size=None, sampler=RankBatchSampler(...))`` (or
    :func:`lightrec.data.rank_dataloader`); each worker builds whole batches with numpy.

    Args:
        batch_size: samples per batch ``B``.
        num_batches: batches in this split (over all ranks).
        split: ``"train"``, ``"val"``, ``"test"`` (disjoint sample streams).
        seed: fixes the hidden model and every sample.
        cardinalities: ``"kaggle"``, ``"1tb"`` or 26 ints.
        scale / num_embeddings_cap: shrink the tables (see :func:`resolve_cardinalities`).
        block_size: samples per generator seed; must divide ``batch_size`` (default: ``batch_size``).
            Keep it fixed to get identical samples under different per-rank batch sizes (drifting ids:
            and ``drift_per_batch / batch_size`` fixed).
        vocabulary: ``"fixed"`` (ids ``[0, n_f)``) or ``"drifting"`` (raw 63-bit ids of a vocabulary
            that drifts; see the module docstring). Host batches only (``device=None``).
        drift_per_batch: with ``"drifting"``, the share of each feature's live ids replaced per
            batch of ``batch_size`` samples (so the ids depend on ``drift_per_batch / batch_size``).
        time_offset_batches: with ``"drifting"``, batches of time before this split's first batch
            (validation and test data come after the training stream).
        device: None (default) draws batches with numpy on the host; a device (``"cuda"``,
            ``"cpu"``) draws them with torch right there (:mod:`lightrec.data.synthetic.device`):
            same hidden model and Bayes AUC, another sample stream, no host-to-device copy, every
            size host-known. Read a CUDA dataset in the main process (``num_workers=0``).
        **model_kwargs: ``zipf_exponent``, ``ids_per_feature``, ``ids_distribution``,
            ``dense_signal``, ``sparse_signal``, ``base_ctr`` of :class:`PlantedCriteoModel`.
    """

    def __init__(
        self,
        batch_size: int = 512,
        num_batches: int = 100,
        split: str = "train",
        seed: int = 0,
        cardinalities: str | Sequence[int] = "kaggle",
        scale: float = 1.0,
        num_embeddings_cap: int | None = None,
        block_size: int | None = None,
        device: torch.device | str | None = None,
        vocabulary: Literal["fixed", "drifting"] = "fixed",
        drift_per_batch: float = 0.02,
        time_offset_batches: int = 0,
        **model_kwargs: object,
    ) -> None:
        if vocabulary not in ("fixed", "drifting"):
            raise ValueError(f"vocabulary must be 'fixed' or 'drifting', got {vocabulary!r}")
        if vocabulary == "drifting" and device is not None:
            raise ValueError(
                f"vocabulary='drifting' draws its batches on the host; use device=None, got device={device!r}"
            )
        if drift_per_batch < 0 or time_offset_batches < 0:
            raise ValueError(
                f"drift_per_batch and time_offset_batches must be >= 0, got {drift_per_batch!r}, {time_offset_batches!r}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        check_at_least(0, num_batches=num_batches)
        block = batch_size if block_size is None else int(block_size)
        if block < 1 or batch_size % block != 0:
            raise ValueError(f"block_size must divide batch_size={batch_size}, got block_size={block_size!r}")
        self.batch_size = int(batch_size)
        self.num_batches = int(num_batches)
        self.split = split
        self._split_code = split_code(split)
        self.block_size = block
        self.num_embeddings_per_feature = resolve_cardinalities(cardinalities, scale, num_embeddings_cap)
        self.vocabulary = vocabulary
        drifting = None
        if vocabulary == "drifting":
            rates = [drift_per_batch * n / batch_size for n in self.num_embeddings_per_feature]
            drifting = DriftingVocabulary(self.num_embeddings_per_feature, rates, seed)
        self.time_offset = int(time_offset_batches) * self.batch_size  # samples
        self.model = PlantedCriteoModel(
            seed, self.num_embeddings_per_feature, vocabulary=drifting, **model_kwargs  # type: ignore[arg-type]
        )
        self.keys = list(DEFAULT_CAT_NAMES)
        self.device = torch.device(device) if device is not None else None
        self._sampler: TorchPlantedSampler | None = None  # built on first use (device tensors)

    def __len__(self) -> int:
        return self.num_batches

    def _blocks(self, index: int) -> list[SampleBlock]:
        if not 0 <= index < self.num_batches:
            raise IndexError(
                f"batch index {index} is out of range for {self.num_batches} batches of split {self.split!r}"
            )
        per, size = self.batch_size // self.block_size, self.block_size
        return [
            self.model.generate_block(self._split_code, k, size, self.time_offset + k * size)
            for k in range(index * per, index * per + per)
        ]

    def __getitem__(self, index: int) -> Batch:
        if self.device is not None:
            return self._device_batch(index)[0]
        return self._to_batch(self._blocks(index))

    def batch_with_probabilities(self, index: int) -> tuple[Batch, torch.Tensor]:
        """Batch ``index`` and the true click probability of each of its samples ``[B]`` (float64)."""
        if self.device is not None:
            batch, device_logit = self._device_batch(index)
            return batch, torch.sigmoid(device_logit)
        blocks = self._blocks(index)
        logit = np.concatenate([b.logit for b in blocks])
        return self._to_batch(blocks), torch.from_numpy(sigmoid(logit))

    def _device_batch(self, index: int) -> tuple[Batch, torch.Tensor]:
        """Batch ``index`` drawn on ``self.device`` and its logits ``[B]`` (see ``device``)."""
        if not 0 <= index < self.num_batches:
            raise IndexError(
                f"batch index {index} is out of range for {self.num_batches} batches of split {self.split!r}"
            )
        if self._sampler is None:
            assert self.device is not None
            self._sampler = TorchPlantedSampler(self.model, self.device)
        per = self.batch_size // self.block_size
        blocks = [self._sampler.generate(self._split_code, index * per + j, self.block_size) for j in range(per)]
        if len(blocks) == 1:
            values, ids_per_key = blocks[0].values, blocks[0].ids_per_key
        else:  # key-major over the whole batch: each key's ids of block 0, then block 1, ...
            pieces = [b.values.split(b.ids_per_key) for b in blocks]
            values = torch.cat([p[f] for f in range(CAT_FEATURE_COUNT) for p in pieces])
            ids_per_key = [sum(b.ids_per_key[f] for b in blocks) for f in range(CAT_FEATURE_COUNT)]
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            lengths=torch.cat([b.lengths for b in blocks], dim=1).reshape(-1),
            stride=self.batch_size,
            length_per_key=ids_per_key,
        )
        batch = Batch(torch.cat([b.dense for b in blocks]), kjt, torch.cat([b.labels for b in blocks]))
        return batch, torch.cat([b.logit for b in blocks])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_sampler"] = None  # rebuilt where the dataset is used (e.g. in a loader worker)
        return state

    def _to_batch(self, blocks: list[SampleBlock]) -> Batch:
        dense = np.concatenate([b.dense for b in blocks])
        labels = np.concatenate([b.labels for b in blocks])
        # Key-major KJT: all ids of cat_0 (block 0, block 1, ...), then cat_1, ...
        values = np.concatenate([b.ids[f] for f in range(CAT_FEATURE_COUNT) for b in blocks])
        lengths = np.concatenate([b.lengths for b in blocks], axis=1)
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(values.astype(np.int64, copy=False)),
            lengths=torch.from_numpy(lengths.reshape(-1)),
            stride=self.batch_size,
            # Ids per key, known here on the host: lookups that need them then read no device value.
            length_per_key=[int(n) for n in lengths.sum(axis=1)],
        )
        return Batch(torch.from_numpy(dense), kjt, torch.from_numpy(labels))

    def bayes_optimal_auc(self, num_samples: int = 1 << 18) -> float:
        """See :meth:`PlantedCriteoModel.bayes_optimal_auc` (same for every split)."""
        return self.model.bayes_optimal_auc(num_samples)

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One table per categorical feature sized for this dataset's ids."""
        return table_configs(embedding_dim, self.num_embeddings_per_feature)
