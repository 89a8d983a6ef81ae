"""torchrec scripts on lightrec's ``lightrec.datasets.criteo``: torchrec's own ``npy_preproc_criteo.py``
passes ``dataset_name`` to ``BinaryCriteoUtils.tsv_to_npys`` (Kaggle's ``test.txt`` has no label),
and torchrec 1.x splits rows with ``get_file_row_ranges_and_remainder``. Checked against a hand
parse of the TSV and a row-by-row reference split."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lightrec.datasets.criteo import (
    CAT_FEATURE_COUNT,
    INT_FEATURE_COUNT,
    BinaryCriteoUtils,
)


def _fields(k: int) -> tuple[list[str], list[str]]:
    dense = [str((k * 7 + j) % 50) if (k + j) % 4 else "" for j in range(INT_FEATURE_COUNT)]
    cats = [format((k * 2654435761 + j * 97) % 2**32, "08x") if (k + j) % 5 else "" for j in range(CAT_FEATURE_COUNT)]
    return dense, cats


def _reference(rows: list[tuple[list[str], list[str]]]) -> tuple[np.ndarray, np.ndarray]:
    dense = np.array([[math.log(int(v or 0) + 3) for v in d] for d, _ in rows], dtype=np.float32)
    sparse = np.array([[int(v, 16) if v else 0 for v in c] for _, c in rows], dtype=np.int64)
    return dense, sparse


def _out(tmp_path: Path) -> list[str]:
    return [str(tmp_path / f"out_{kind}.npy") for kind in ("dense", "sparse", "labels")]


def test_tsv_to_npys_reads_kaggle_test_txt_without_labels(tmp_path: Path) -> None:
    # was: TypeError (no dataset_name argument); positionally, "wrong column count" (39 fields)
    rows = [_fields(k) for k in range(5)]
    src = tmp_path / "test.txt"
    src.write_text("".join("\t".join(d + c) + "\n" for d, c in rows))
    BinaryCriteoUtils.tsv_to_npys(str(src), *_out(tmp_path), dataset_name="criteo_kaggle")
    dense, sparse, labels = (np.load(p) for p in _out(tmp_path))
    ref_dense, ref_sparse = _reference(rows)
    np.testing.assert_allclose(dense, ref_dense, rtol=1e-6)
    np.testing.assert_array_equal(sparse, ref_sparse)
    assert labels.shape == (5, 1) and labels.dtype == np.int32 and (labels == -1).all()


def test_tsv_to_npys_takes_dataset_name_fifth_as_torchrecs_script_passes_it(tmp_path: Path) -> None:
    rows = [_fields(k) for k in range(4)]
    src = tmp_path / "test.txt"
    src.write_text("".join("\t".join(d + c) + "\n" for d, c in rows))
    BinaryCriteoUtils.tsv_to_npys(str(src), *_out(tmp_path), "criteo_kaggle")
    assert (np.load(_out(tmp_path)[2]) == -1).all()


@pytest.mark.parametrize("dataset_name", ["criteo_1tb", "criteo_kaggle"])
def test_tsv_to_npys_keeps_the_labels_of_a_training_file(tmp_path: Path, dataset_name: str) -> None:
    rows = [_fields(k) for k in range(6)]
    (tmp_path / "tests").mkdir()  # "test" in a folder name is no Kaggle test.txt
    src = tmp_path / "tests" / "train.txt"
    src.write_text("".join("\t".join([str(k % 2), *d, *c]) + "\n" for k, (d, c) in enumerate(rows)))
    BinaryCriteoUtils.tsv_to_npys(str(src), *_out(tmp_path), dataset_name=dataset_name)
    dense, sparse, labels = (np.load(p) for p in _out(tmp_path))
    ref_dense, ref_sparse = _reference(rows)
    np.testing.assert_allclose(dense, ref_dense, rtol=1e-6)
    np.testing.assert_array_equal(sparse, ref_sparse)
    assert labels.reshape(-1).tolist() == [k % 2 for k in range(6)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("start_row", "last_row"), [(0, None), (2, None), (3, 9)])
def test_get_file_row_ranges_and_remainder_cover_every_row_once(
    world_size: int, start_row: int, last_row: int | None
) -> None:
    # was: AttributeError (torchrec 1.x's name was missing)
    lengths = [4, 0, 5, 3]
    owner = {}  # global row -> (file, local row)
    g = 0
    for idx, n in enumerate(lengths):
        for local in range(n):
            owner[g] = (idx, local)
            g += 1
    end = sum(lengths) - 1 if last_row is None else last_row
    wanted = list(range(start_row, end + 1))
    seen: list[int] = []
    remainders = set()
    sizes = []
    for rank in range(world_size):
        ranges, remainder = BinaryCriteoUtils.get_file_row_ranges_and_remainder(
            lengths, rank, world_size, start_row, last_row
        )
        remainders.add(remainder)
        mine = [g for g, (idx, local) in owner.items() if idx in ranges and ranges[idx][0] <= local <= ranges[idx][1]]
        sizes.append(len(mine))
        seen += mine
    assert sorted(seen) == wanted and len(seen) == len(wanted)
    assert remainders == {len(wanted) % world_size}
    # torchrec's split: contiguous shares, the first `remainder` ranks one row more
    base = len(wanted) // world_size
    assert sizes == [base + (r < len(wanted) % world_size) for r in range(world_size)]
