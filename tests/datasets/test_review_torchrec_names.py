"""torchrec.datasets.utils' split, limit and concatenation helpers at lightrec.datasets.utils: each
checked against rows computed here from torchrec's rules (index modulo, seeded ``random.Random``)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from torch.utils.data import DataLoader

import lightrec.data.csv_readers as splits
from lightrec.datasets.utils import (
    Limit,
    ParallelReadConcat,
    idx_split_train_val,
    rand_split_train_val,
    train_filter,
    val_filter,
)


def test_idx_split_keeps_the_first_train_perc_of_every_hundred() -> None:
    train, val = idx_split_train_val(list(range(250)), 0.3)
    expected = [*range(0, 30), *range(100, 130), *range(200, 230)]
    assert list(train) == expected
    assert list(val) == [i for i in range(250) if i not in set(expected)]
    assert list(train) == expected  # a second pass gives the same rows


def test_idx_split_key_fn_and_decimal_places() -> None:
    # key 7*i % 10 < round(0.55 * 10) = 6
    train, val = idx_split_train_val(range(20), 0.55, decimal_places=1, key_fn=lambda i: 7 * i)
    # 7*i % 10 for i = 0..9: 0 7 4 1 8 5 2 9 6 3, then again for i = 10..19
    assert list(train) == [0, 2, 3, 5, 6, 9, 10, 12, 13, 15, 16, 19]
    assert list(val) == [1, 4, 7, 8, 11, 14, 17, 18]
    assert train_filter(lambda i: i, 0.125, 3, 124) and not train_filter(lambda i: i, 0.125, 3, 125)
    assert train_filter(lambda i: i, 0.125, 3, 1124)  # keys wrap every 10**decimal_places
    assert val_filter(lambda i: i, 0.125, 3, 125) and not val_filter(lambda i: i, 0.125, 3, 0)


@pytest.mark.parametrize("seed", [0, 7])
def test_rand_split_follows_seeded_draws(seed: int) -> None:
    rows = [f"row{i}" for i in range(200)]
    rng = random.Random(seed)
    in_train = [rng.random() < 0.6 for _ in rows]
    train, val = rand_split_train_val(rows, 0.6, random_seed=seed) if seed else rand_split_train_val(rows, 0.6)
    assert list(train) == [r for r, t in zip(rows, in_train) if t]
    assert list(val) == [r for r, t in zip(rows, in_train) if not t]
    assert list(train) == [r for r, t in zip(rows, in_train) if t]  # the draws restart every pass
    assert 0 < len(list(val)) < len(rows)


def test_limit() -> None:
    assert list(Limit(range(10), 3)) == [0, 1, 2]
    assert list(Limit(range(2), 5)) == [0, 1]
    assert list(Limit(range(4), 0)) == []
    lim = Limit(iter_twice := [1, 2, 3], 2)
    assert list(lim) == list(lim) == iter_twice[:2]


def test_parallel_read_concat_in_one_process_and_in_workers() -> None:
    sources = [list(range(0, 4)), list(range(10, 13)), list(range(20, 25))]
    assert list(ParallelReadConcat(*sources)) == [*sources[0], *sources[1], *sources[2]]
    loaded = list(DataLoader(ParallelReadConcat(*sources), num_workers=2, batch_size=None))
    assert sorted(int(x) for x in loaded) == sorted(sources[0] + sources[1] + sources[2])  # each row once
    picked = ParallelReadConcat(*sources, dp_selector=lambda dps: dps[2:])
    assert list(picked) == sources[2]


def test_default_selector_gives_each_worker_a_contiguous_share(monkeypatch: pytest.MonkeyPatch) -> None:
    sources = [[i] for i in range(5)]
    shares = []
    for worker in range(3):
        monkeypatch.setattr(splits, "get_worker_info", lambda w=worker: SimpleNamespace(num_workers=3, id=w))
        shares.append(list(ParallelReadConcat(*sources)))
    assert shares == [[0, 1], [2, 3], [4]]
    monkeypatch.setattr(splits, "get_worker_info", lambda: SimpleNamespace(num_workers=6, id=0))
    with pytest.raises(ValueError, match=r"num_workers=6\) exceeds the number of sources \(5\)"):
        list(ParallelReadConcat(*sources))


def test_bad_arguments_name_themselves() -> None:
    for perc in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=rf"train_perc={perc!r}\).*range \(0.0, 1.0\)"):
            idx_split_train_val(range(3), perc)
        with pytest.raises(ValueError, match=rf"rand_split_train_val\(train_perc={perc!r}\)"):
            rand_split_train_val(range(3), perc)
    with pytest.raises(TypeError, match="datapipe=...\\) must be an iterable of rows.*got int"):
        rand_split_train_val(5, 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decimal_places=-1"):
        idx_split_train_val(range(3), 0.5, decimal_places=-1)
    with pytest.raises(TypeError, match="random_seed='a'"):
        rand_split_train_val(range(3), 0.5, random_seed="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Limit\\(limit=-1\\)"):
        Limit(range(3), -1)
