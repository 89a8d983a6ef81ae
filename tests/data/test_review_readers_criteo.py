"""Review of the Criteo readers against references computed here from tiny hand-written files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lightrec.data import CriteoMemmapDataset, preprocess_criteo
from lightrec.data.errors import DataFormatError
from lightrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe, criteo_kaggle, criteo_terabyte


def _tsv_line(label: int, dense: list[object], cats: list[str], end: str = "\n") -> str:
    return "\t".join([str(label), *(str(d) for d in dense), *cats]) + end


def _write_days(tmp_path: Path, rows_per_day: list[int]) -> tuple[list[list[str]], int]:
    """Binary Criteo days whose dense column 0 and every id number the rows 0.. across the days."""
    paths: list[list[str]] = [[], [], []]
    first = 0
    for day, rows in enumerate(rows_per_day):
        index = np.arange(first, first + rows)
        arrays = (np.repeat(index[:, None], 13, 1).astype(np.float32), np.repeat(index[:, None], 26, 1),
                  (index[:, None] % 2).astype(np.int32))  # fmt: skip
        for k, (kind, array) in enumerate(zip(("dense", "sparse", "labels"), arrays)):
            path = tmp_path / f"day_{day}_{kind}.npy"
            np.save(path, array)
            paths[k].append(str(path))
        first += rows
    return paths, first


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    ("rows_per_day", "world_size", "batch_size"),
    [([5, 4], 2, 4), ([7], 3, 2), ([6, 5], 2, 4), ([3, 3, 4], 4, 3), ([9], 2, 5)],
)
def test_binary_criteo_ranks_yield_as_many_batches_and_every_row_once(
    tmp_path: Path, rows_per_day: list[int], world_size: int, batch_size: int, shuffle: bool
) -> None:
    paths, total = _write_days(tmp_path, rows_per_day)
    base = total // world_size
    seen: list[int] = []
    counts = []
    for rank in range(world_size):
        pipe = InMemoryBinaryCriteoIterDataPipe("train", *paths, batch_size, rank, world_size,
                                                shuffle_training_set=shuffle)  # fmt: skip
        sizes = [b.batch_size for b in pipe]
        counts.append(len(sizes))
        assert len(pipe) == len(sizes) == math.ceil(base / batch_size)  # DDP ranks step together
        assert all(s == batch_size for s in sizes[:-1])
        seen += [int(x) for b in pipe for x in b.dense_features[:, 0]]
    assert sorted(seen) == list(range(total))  # drop_last=False: every row exactly once


@pytest.mark.parametrize(
    ("rows_per_day", "world_size", "batch_size"), [([5, 4], 2, 4), ([9], 2, 5), ([7], 3, 2)]
)
def test_binary_criteo_drop_last_gives_every_rank_the_same_full_batches(
    tmp_path: Path, rows_per_day: list[int], world_size: int, batch_size: int
) -> None:
    paths, total = _write_days(tmp_path, rows_per_day)
    expected = (total // world_size) // batch_size
    for rank in range(world_size):
        pipe = InMemoryBinaryCriteoIterDataPipe("train", *paths, batch_size, rank, world_size, drop_last=True)
        assert [b.batch_size for b in pipe] == [batch_size] * expected and len(pipe) == expected


def test_binary_criteo_refuses_a_rank_outside_the_world(tmp_path: Path) -> None:
    paths, _ = _write_days(tmp_path, [4])
    for shuffle in (False, True):
        with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
            InMemoryBinaryCriteoIterDataPipe("train", *paths, 2, 2, 2, shuffle_training_set=shuffle)
    with pytest.raises(ValueError, match="batch_size and world_size must be >= 1, got 0"):
        InMemoryBinaryCriteoIterDataPipe("train", *paths, 0, 0, 1)


def test_binary_criteo_shuffle_batches_is_a_seeded_permutation_inside_each_batch(tmp_path: Path) -> None:
    paths, _ = _write_days(tmp_path, [6, 4])

    def rows(seed: int, shuffle: bool) -> list[list[int]]:
        pipe = InMemoryBinaryCriteoIterDataPipe("train", *paths, 4, 0, 1, shuffle_batches=shuffle,
                                                shuffle_training_set_random_seed=seed)  # fmt: skip
        out = []
        for b in pipe:
            assert torch.equal(b.sparse_features["cat_7"].values(), b.dense_features[:, 0].long())
            assert torch.equal(b.labels, (b.dense_features[:, 0].long() % 2).int())
            out.append([int(x) for x in b.dense_features[:, 0]])
        return out

    plain, shuffled = rows(0, False), rows(0, True)
    assert shuffled == rows(0, True) and [sorted(r) for r in shuffled] == plain
    assert any(rows(s, True) != plain for s in range(5))


def test_criteo_tsv_row_with_too_many_fields_names_file_and_line(tmp_path: Path) -> None:
    good = _tsv_line(1, list(range(13)), ["a1"] * 26)
    path = tmp_path / "day_0"
    path.write_text(good + good.replace("\n", "\t\n") + good)  # line 2: a stray trailing tab
    with pytest.raises(DataFormatError, match=r"day_0:2: a Criteo row has at most 40 .* got 41") as info:
        list(criteo_kaggle(str(path)))
    assert info.value.line == 2
    kept = list(criteo_terabyte([str(path)], on_error="skip"))
    assert len(kept) == 2 and all(r["label"] == 1 and r["int_0"] == 0 for r in kept)
    assert len(list(criteo_kaggle(str(path), row_mapper=None))[1]) == 41  # raw rows are the user's business


def test_criteo_tsv_rows_crlf_missing_newline_and_empty_fields(tmp_path: Path) -> None:
    dense: list[object] = [3, -2, "", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    cats = ["7F", "", "abcDEF12"] + ["0"] * 23
    path = tmp_path / "train.txt"
    path.write_bytes((_tsv_line(0, dense, cats, "\r\n") + _tsv_line(1, dense, cats, "")).encode())
    rows = list(criteo_kaggle(str(path)))
    assert [r["label"] for r in rows] == [0, 1]
    assert (
        rows[1]["int_1"] == -2
        and rows[1]["int_2"] == 0
        and rows[1]["cat_1"] == ""
        and rows[1]["cat_2"] == "abcDEF12"
    )


def test_preprocessed_criteo_matches_log1p_and_modulo_reference(tmp_path: Path) -> None:
    dense: list[object] = [3, -2, "", 0, 1, 2, 3, 4, 5, 6, 7, 8, 1000]
    cats = ["7F", "", "abcDEF12", "FFFFFFFF"] + [f"{i:x}" for i in range(22)]
    path = tmp_path / "day_0"
    path.write_bytes((_tsv_line(1, dense, cats, "\r\n") + _tsv_line(0, dense, cats, "")).encode())
    cap = 101
    preprocess_criteo(path, tmp_path / "out", num_embeddings_cap=cap, progress=False)
    batch = CriteoMemmapDataset(tmp_path / "out", batch_size=2)[0]
    ref_dense = [math.log(max(float(x or 0), 0.0) + 1.0) for x in dense]
    np.testing.assert_allclose(batch.dense_features.numpy(), np.array([ref_dense] * 2), rtol=1e-6)
    ref_ids = [0 if not c else 1 + int(c, 16) % (cap - 1) for c in cats]
    got = [batch.sparse_features[f"cat_{f}"].values().tolist() for f in range(26)]
    assert got == [[i, i] for i in ref_ids] and batch.labels.tolist() == [1.0, 0.0]
