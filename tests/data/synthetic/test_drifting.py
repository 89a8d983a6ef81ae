"""``vocabulary="drifting"`` of the synthetic Criteo data: raw 63-bit ids that are born and die at the
set rate, keep their popularity while they live, evaluation data after the training stream, the
same batches however they are read, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from lightrec.data import SyntheticCriteo, SyntheticCriteoDataset
from lightrec.data.synthetic import DriftingVocabulary

CAP = 400


def _dataset(**kwargs: object) -> SyntheticCriteoDataset:
    base: dict[str, object] = dict(batch_size=200, num_batches=60, num_embeddings_cap=CAP, vocabulary="drifting",
                                   drift_per_batch=0.05, seed=4)  # fmt: skip
    return SyntheticCriteoDataset(**(base | kwargs))  # type: ignore[arg-type]


def _ids(dataset: SyntheticCriteoDataset, index: int, feature: str = "cat_2") -> np.ndarray:
    return dataset[index].sparse_features[feature].values().numpy()


def test_ids_are_raw_63_bit_and_the_vocabulary_drifts_at_its_rate() -> None:
    ds = _dataset()
    first = np.concatenate([_ids(ds, i) for i in range(5)])
    last = np.concatenate([_ids(ds, i) for i in range(55, 60)])
    assert first.dtype == np.int64 and int(first.min()) >= 0 and int(first.max()) > 2**40  # spread over 2**63
    n = ds.num_embeddings_per_feature[2]
    assert n == CAP
    # 0.05 of the vocabulary per batch: after 50 batches ~2.5 vocabularies were born, the early ids are gone
    assert len(set(first) & set(last)) == 0
    seen = set(np.concatenate([_ids(ds, i) for i in range(60)]).tolist())
    assert CAP < len(seen) <= DriftingVocabulary([CAP], 0.05 * CAP / 200, 4).distinct_ids(0, 60 * 200)


def test_an_id_keeps_its_position_while_it_lives() -> None:
    vocab = DriftingVocabulary([10], 0.5, seed=1)  # a birth every two samples
    positions = np.arange(10)
    at = {t: vocab.ids(0, positions, t) for t in (0, 4, 8)}
    # two births by t=4: positions of the two oldest ids got new ids, the others kept theirs
    changed = at[0] != at[4]
    assert int(changed.sum()) == 2 and set(np.nonzero(changed)[0].tolist()) == {0, 1}
    assert int((at[4] != at[8]).sum()) == 2
    assert len(set(at[0]) | set(at[4]) | set(at[8])) == 14


def test_evaluation_data_follows_the_training_stream() -> None:
    dm = SyntheticCriteo(batch_size=200, num_train_batches=40, num_val_batches=2, num_test_batches=2,
                         num_embeddings_cap=CAP, vocabulary="drifting", drift_per_batch=0.05, seed=4)  # fmt: skip
    train, val = dm.datasets["train"], dm.datasets["val"]
    early = set(np.concatenate([_ids(train, i) for i in range(3)]).tolist())
    late = set(np.concatenate([_ids(train, i) for i in range(37, 40)]).tolist())
    evaluation = np.concatenate([_ids(val, i) for i in range(2)])
    known_late = np.isin(evaluation, list(late)).mean()  # share of lookups of ids seen at the end of training
    assert known_late > 0.5 and not set(evaluation.tolist()) & early


def test_batches_do_not_depend_on_how_they_are_read() -> None:
    whole = _dataset(batch_size=200, block_size=100)
    halves = _dataset(batch_size=100, block_size=100, drift_per_batch=0.025)  # the same rate per sample
    for i in range(3):
        a = whole[i].sparse_features["cat_5"].values().numpy()
        b = np.concatenate([halves[2 * i].sparse_features["cat_5"].values().numpy(),
                            halves[2 * i + 1].sparse_features["cat_5"].values().numpy()])  # fmt: skip
        assert np.array_equal(a, b)
    assert np.array_equal(_ids(whole, 7), _ids(_dataset(batch_size=200, block_size=100), 7))


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="vocabulary must be"):
        _dataset(vocabulary="sliding")
    with pytest.raises(ValueError, match="device=None"):
        _dataset(device="cpu")
    with pytest.raises(ValueError, match="shuffle=False"):
        SyntheticCriteo(vocabulary="drifting", shuffle=True)
    with pytest.raises(ValueError, match="drift_per_batch"):
        _dataset(drift_per_batch=-1.0)
