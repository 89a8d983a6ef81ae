"""Resuming a synthetic stream with another batch size: a drifting vocabulary drifts ``drift_per_batch``
per batch, so its ids depend on ``drift_per_batch / batch_size``; a checkpoint of another drift per sample
is refused, one of the same drift per sample (and ``block_size``) continues sample for sample."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec.data import Batch, ResumeMismatchError, SyntheticStream
from lightrec.data.batch import concat_batches
from lightrec.data.synthetic.stream import SyntheticStreamLoader
from tests.data.synthetic.test_stream import _read

SMALL: dict[str, Any] = {"seed": 1, "num_embeddings_cap": 300, "block_size": 32}


def _stream(batch_size: int, **kwargs: Any) -> SyntheticStream:
    return SyntheticStream(**{"batch_size": batch_size, **SMALL, **kwargs})


def _loader(data: SyntheticStream, rank: int = 0, world_size: int = 1) -> SyntheticStreamLoader:
    loader = SyntheticStreamLoader(data.dataset, rank, world_size, fingerprint=data.fingerprint)
    loader.read_ahead = 0  # iterated by hand: every batch read is trained
    return loader


def _ids(batch: Batch, key: str = "cat_0") -> torch.Tensor:
    return batch.sparse_features[key].values()


def test_a_drifting_checkpoint_of_another_batch_size_is_refused_naming_the_batch_size() -> None:
    big, small = _stream(64, drift_per_batch=0.05), _stream(32, drift_per_batch=0.05)
    # the same dense values, other ids: the drift per sample is 0.05 / 64 there, 0.05 / 32 here
    assert torch.equal(big.dataset[40].dense_features, concat_batches([small.dataset[80], small.dataset[81]]).dense_features)
    assert not torch.equal(_ids(big.dataset[40]), torch.cat([_ids(small.dataset[80]), _ids(small.dataset[81])]))
    assert big.fingerprint != small.fingerprint
    first = _loader(big)
    _read(first, 4)
    with pytest.raises(ResumeMismatchError, match="batch size was 64, not 32"):
        _loader(small).load_state_dict(first.state_dict())


def test_a_drifting_checkpoint_resumes_at_another_batch_size_of_the_same_drift_per_sample() -> None:
    big, small = _stream(64, drift_per_batch=0.05), _stream(32, drift_per_batch=0.025)
    assert big.fingerprint == small.fingerprint
    first = _loader(big)
    _read(first, 4)  # global batches 0..3 of 64: 256 samples
    state = first.state_dict()
    # two ranks of batch 32 continue at the samples one rank of batch 64 would read next (batches 4 and 5)
    ranks = [_loader(small, rank, 2) for rank in range(2)]
    for loader in ranks:
        loader.load_state_dict(state)
    got = [_read(loader, 2) for loader in ranks]
    for step in range(2):
        want, both = big.dataset[4 + step], concat_batches([got[0][step], got[1][step]])
        assert torch.equal(both.dense_features, want.dense_features) and torch.equal(both.labels, want.labels)
        for f in range(26):
            assert torch.equal(_ids(both, f"cat_{f}"), _ids(want, f"cat_{f}"))


def test_the_fixed_vocabulary_keeps_its_fingerprint_and_its_samples_at_any_batch_size() -> None:
    data = _stream(32, vocabulary="fixed")
    assert data.fingerprint == "b55074aade53f292"  # as before the fix: checkpoints of fixed streams still resume
    big = _stream(64, vocabulary="fixed")
    assert big.fingerprint == data.fingerprint
    both = concat_batches([data.dataset[6], data.dataset[7]])
    assert torch.equal(_ids(both), _ids(big.dataset[3])) and torch.equal(both.labels, big.dataset[3].labels)
