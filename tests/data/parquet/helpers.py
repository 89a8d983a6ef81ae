"""Event data written to Parquet for the tests, and the batches it must give, built by hand from its rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lightrec.data import Batch

DENSE = ["d_float", "d_int"]
#: feature -> (ids column, weights column or None)
SPARSE = {"scalar": ("scalar", None), "narrow": ("narrow", None), "multi": ("multi", None), "weighted": ("tags", "tag_w")}
ROWS = {"scalar": 50, "narrow": 20, "multi": 30, "weighted": 40}


def event_table(rows: int, seed: int = 0, start: int = 0) -> pa.Table:
    """Rows of every kind the reader takes: float and int dense with nulls and NaN, int64 and int32
    scalar ids, multi-hot lists with empty ones, weighted lists; labels 0/1 (int8)."""
    rng = np.random.default_rng(seed)
    index = np.arange(start, start + rows)
    d_float = rng.random(rows).astype(np.float32)
    d_float[index % 11 == 3] = np.nan
    multi = [list(rng.integers(0, ROWS["multi"], int(k))) for k in rng.integers(0, 4, rows)]
    tags = [list(rng.integers(0, ROWS["weighted"], int(k))) for k in rng.integers(0, 3, rows)]
    return pa.table(
        {
            "label": pa.array(rng.integers(0, 2, rows).astype(np.int8)),
            "d_float": pa.array(d_float, mask=index % 13 == 5),
            "d_int": pa.array(rng.integers(-5, 100, rows).astype(np.int32), mask=index % 7 == 0),
            "scalar": pa.array(rng.integers(0, ROWS["scalar"], rows)),
            "narrow": pa.array(rng.integers(0, ROWS["narrow"], rows).astype(np.int32)),
            "multi": pa.array(multi, pa.list_(pa.int64())),
            "tags": pa.array(tags, pa.list_(pa.int64())),
            "tag_w": pa.array([list(rng.random(len(t)).astype(np.float32)) for t in tags], pa.list_(pa.float32())),
            "row": pa.array(index),  # not a feature: lets a test see which rows a batch holds
        }
    )


def write_events(root: Path, files: list[tuple[str, int, int]], seed: int = 0) -> pa.Table:
    """Write ``(relative path, rows, row group size)`` files under ``root``; returns all rows in path order."""
    tables, start = {}, 0
    for k, (name, rows, group) in enumerate(files):
        table = event_table(rows, seed + k, start)
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=group)
        tables[str(path)] = table
        start += rows
    return pa.concat_tables([tables[p] for p in sorted(tables)])


def sparse_option() -> dict[str, Any]:
    return {name: {"column": col, **({"weights": w} if w else {})} for name, (col, w) in SPARSE.items()}


def expected_batch(rows: pa.Table, dense_fill: float = 0.0) -> Batch:
    """The batch of ``rows`` built by hand: a Python loop over keys and rows (the definition of the layout)."""
    dense = []
    for name in DENSE:
        column = rows.column(name).to_pylist()
        dense.append([dense_fill if v is None or v != v else float(v) for v in column])
    values: list[int] = []
    weights: list[float] = []
    lengths: list[int] = []
    for col, w in SPARSE.values():
        ids = rows.column(col).to_pylist()
        ws = rows.column(w).to_pylist() if w else None
        for i, v in enumerate(ids):
            bag = v if isinstance(v, list) else [v]
            values += bag
            lengths.append(len(bag))
            weights += ws[i] if ws else [1.0] * len(bag)
    from lightrec.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(
        keys=list(SPARSE),
        values=torch.tensor(values, dtype=torch.int64),
        weights=torch.tensor(weights, dtype=torch.float32),
        lengths=torch.tensor(lengths, dtype=torch.int32),
        stride=rows.num_rows,
    )
    return Batch(
        torch.tensor(dense, dtype=torch.float32).reshape(len(DENSE), -1).T.contiguous(),
        kjt,
        torch.tensor(rows.column("label").to_pylist(), dtype=torch.float32),
    )


def assert_batches_equal(got: Batch, want: Batch) -> None:
    """Value for value: dense, labels, keys, values, lengths and weights."""
    torch.testing.assert_close(got.dense_features, want.dense_features, rtol=0, atol=0)
    torch.testing.assert_close(got.labels, want.labels, rtol=0, atol=0)
    g, w = got.sparse_features, want.sparse_features
    assert g.keys() == w.keys()
    assert torch.equal(g.values(), w.values())
    assert torch.equal(g.lengths(), w.lengths())
    assert g.stride() == w.stride()
    assert (g.weights_or_none() is None) == (w.weights_or_none() is None)
    if g.weights_or_none() is not None:
        assert torch.equal(g.weights(), w.weights())
    assert g.length_per_key() == w.length_per_key()

