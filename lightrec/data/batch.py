"""``Batch``: what every lightrec data loader yields and every ``RecModule`` step receives.

Layout of one batch of ``B`` samples::

    dense_features   [B, num_dense]  float32   (Criteo: 13 log-transformed counts; may be [B, 0])
    sparse_features  KeyedJaggedTensor, stride B, key-major ids (Criteo: 26 keys, one id per sample)
    labels           [B]             float32   (0./1. for click prediction, ratings for regression)

Datasets in :mod:`lightrec.data` build whole batches at once (vectorised numpy, one item per
batch) and are read with ``DataLoader(batch_size=None)``; :func:`collate_samples` is there for
per-sample datasets, which are far slower (one Python dict per sample).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lightrec.sparse import KeyedJaggedTensor

__all__ = ["Batch", "collate_samples", "concat_batches"]


@dataclass
class Batch:
    """One batch of dense features, sparse features and labels (torchrec's ``Batch`` fields).

    Args:
        dense_features: ``[B, num_dense]`` float tensor.
        sparse_features: ``KeyedJaggedTensor`` with ``stride() == B``.
        labels: ``[B]`` float tensor.
    """

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.sparse_features, KeyedJaggedTensor):
            raise TypeError(
                f"Batch.sparse_features must be a KeyedJaggedTensor, got {type(self.sparse_features).__name__}"
            )
        if self.dense_features.dim() != 2:
            raise ValueError(
                f"Batch.dense_features must be [B, num_dense], got shape {list(self.dense_features.shape)}"
            )
        b = self.dense_features.shape[0]
        if self.labels.shape != (b,):
            raise ValueError(
                f"Batch.labels must have shape [{b}] to match dense_features {list(self.dense_features.shape)}, "
                f"got {list(self.labels.shape)}"
            )
        if len(self.sparse_features.keys()) > 0 and self.sparse_features.stride() != b:
            raise ValueError(
                f"Batch.sparse_features has batch size (stride) {self.sparse_features.stride()} but "
                f"dense_features has {b} rows; both must describe the same samples"
            )

    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool | None = None) -> Batch:
        """Copy to ``device`` (tensors already there are kept, not copied).

        ``non_blocking=None`` (the default) copies asynchronously whenever the target is a CUDA
        device: host-to-device copies are safe to queue (from pinned memory they really overlap
        compute; from pageable memory torch stages them), and Lightning's default
        ``batch_to_device`` calls ``batch.to(device)`` without the flag. Pass ``False`` to wait.
        """
        device = torch.device(device)
        if non_blocking is None:
            non_blocking = device.type == "cuda"
        return Batch(
            dense_features=self.dense_features.to(device, non_blocking=non_blocking),
            sparse_features=self.sparse_features.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        """Copy into page-locked host memory (``DataLoader(pin_memory=True)`` calls this)."""
        return Batch(
            dense_features=self.dense_features.pin_memory(),
            sparse_features=self.sparse_features.pin_memory(),
            labels=self.labels.pin_memory(),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as used by ``stream`` so the CUDA allocator does not reuse it early."""
        self.dense_features.record_stream(stream)
        self.sparse_features.record_stream(stream)
        self.labels.record_stream(stream)


def _ids_of(value: object, key: str, index: int) -> list[int]:
    """One sample's ids of one feature as a list (an int, a sequence, or a 1-D tensor / numpy array)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim > 1:
            raise ValueError(
                f"sample {index}: feature {key!r} must be 1-D ids, got shape {list(value.shape)}"
            )
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, numbers.Integral):  # int and numpy's integer scalars (np.int64 ...)
        return [int(value)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [int(v) for v in value]
    raise TypeError(
        f"sample {index}: feature {key!r} must be an int, a sequence of ints or a 1-D tensor or array, "
        f"got {type(value).__name__}"
    )


def _unpack(sample: object, index: int) -> tuple[object, Mapping[str, object], object]:
    if isinstance(sample, Mapping):
        missing = [k for k in ("dense", "sparse", "label") if k not in sample]
        if missing:
            raise KeyError(
                f"sample {index} lacks {missing}; per-sample dicts need 'dense', 'sparse' and 'label', "
                f"got keys {sorted(sample)}"
            )
        return sample["dense"], sample["sparse"], sample["label"]
    if isinstance(sample, Sequence) and len(sample) == 3:
        return sample[0], sample[1], sample[2]
    raise TypeError(
        f"sample {index} must be a dict with 'dense', 'sparse', 'label' or a (dense, sparse, label) tuple, "
        f"got {type(sample).__name__}"
    )


def collate_samples(samples: Sequence[object], keys: Sequence[str] | None = None) -> Batch:
    """Build one :class:`Batch` from per-sample rows.

    Each sample is ``{"dense": [num_dense] floats, "sparse": {feature: ids}, "label": float}`` or
    the tuple ``(dense, sparse, label)``; ``ids`` is an int (numpy integer scalars too), a list of
    ints or a 1-D tensor or numpy array (an empty list is an empty bag). Use as ``DataLoader(ds, batch_size=B, collate_fn=collate_samples)``.

    Args:
        samples: the rows of the batch (at least one).
        keys: feature order of the KJT; defaults to the first sample's ``sparse`` key order. Every
            sample must have every key.

    Returns:
        A ``Batch`` with int64 ids and int32 lengths.
    """
    if len(samples) == 0:
        raise ValueError("collate_samples needs at least one sample, got an empty list")
    unpacked = [_unpack(s, i) for i, s in enumerate(samples)]
    if keys is None:
        keys = list(unpacked[0][1].keys())
    keys = list(keys)
    dense = torch.stack([torch.as_tensor(d, dtype=torch.float32).reshape(-1) for d, _, _ in unpacked])
    labels = torch.tensor([float(torch.as_tensor(lab)) for _, _, lab in unpacked], dtype=torch.float32)
    values: list[int] = []
    lengths: list[int] = []
    for key in keys:
        for i, (_, sparse, _) in enumerate(unpacked):
            if key not in sparse:
                raise KeyError(f"sample {i} has no sparse feature {key!r}; it has {sorted(sparse)}")
            ids = _ids_of(sparse[key], key, i)
            values.extend(ids)
            lengths.append(len(ids))
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int32),
        stride=len(samples),
    )
    return Batch(dense_features=dense, sparse_features=kjt, labels=labels)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Stack batches along the sample dimension (same keys, same number of dense features).

    The result's samples are those of ``batches[0]``, then ``batches[1]``, and so on; this is the
    global batch that several ranks see together in one step.
    """
    if len(batches) == 0:
        raise ValueError("concat_batches needs at least one Batch, got an empty list")
    if len(batches) == 1:
        return batches[0]
    keys = batches[0].sparse_features.keys()
    weighted = batches[0].sparse_features.weights_or_none() is not None
    dense_shape = tuple(batches[0].dense_features.shape[1:])
    for i, b in enumerate(batches):
        if b.sparse_features.keys() != keys:
            raise ValueError(
                f"concat_batches: batch {i} has keys {b.sparse_features.keys()}, batch 0 has {keys}"
            )
        if (b.sparse_features.weights_or_none() is not None) != weighted:
            raise ValueError(
                f"concat_batches: batch {i} {'has' if not weighted else 'has no'} per-id weights, batch 0 "
                f"{'has' if weighted else 'has none'}; give every batch weights, or none"
            )
        if tuple(b.dense_features.shape[1:]) != dense_shape:
            raise ValueError(
                f"concat_batches: batch {i} has dense_features of shape {list(b.dense_features.shape)}, batch 0 "
                f"{list(batches[0].dense_features.shape)}; concatenate batches with the same dense features per sample"
            )
    values, weights, lengths = [], [], []
    for key in keys:
        for b in batches:
            jt = b.sparse_features[key]
            values.append(jt.values())
            lengths.append(jt.lengths())
            if weighted:
                weights.append(jt.weights())
    kjt = KeyedJaggedTensor(
        keys=list(keys),
        values=torch.cat(values) if values else batches[0].sparse_features.values(),
        weights=torch.cat(weights) if weighted else None,
        lengths=torch.cat(lengths) if lengths else batches[0].sparse_features.lengths(),
        stride=sum(b.batch_size for b in batches),
    )
    return Batch(
        dense_features=torch.cat([b.dense_features for b in batches]),
        sparse_features=kjt,
        labels=torch.cat([b.labels for b in batches]),
    )
