"""MovieLens readers on small files in the three real formats, and the DataModule splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightrec.data import DataFormatError, MovieLensDataset, read_movielens
from lightrec.data.datamodules import MovieLensDataModule
from lightrec.data.movielens.reader import ML100K_GENRES

# (user, item, rating, ts) — raw ids on purpose sparse, so renumbering is visible.
RATINGS = [
    (10, 100, 5, 1000),
    (10, 200, 3, 1001),
    (20, 100, 4, 999),
    (30, 300, 1, 1003),
    (20, 300, 4, 1004),
    (30, 100, 2, 998),
]
GENRES = {100: ["Animation", "Comedy"], 200: ["Drama"], 300: []}
USERS = {10: ("M", 24, "technician"), 20: ("F", 53, "writer"), 30: ("M", 17, "student")}


def _ml100k(d: Path) -> Path:
    d.mkdir()
    (d / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS))
    (d / "u.user").write_text("".join(f"{u}|{a}|{g}|{o}|85711\n" for u, (g, a, o) in USERS.items()))
    lines = []
    for item, gs in GENRES.items():
        flags = "|".join("1" if g in gs else "0" for g in ML100K_GENRES)
        lines.append(f"{item}|Café Noir ({item})|01-Jan-1995||http://x|{flags}\n")
    (d / "u.item").write_bytes("".join(lines).encode("latin-1"))
    return d


def _ml1m(d: Path) -> Path:
    d.mkdir()
    (d / "ratings.dat").write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in RATINGS))
    ages = {10: 18, 20: 50, 30: 1}
    (d / "users.dat").write_text(
        "".join(f"{u}::{g}::{ages[u]}::{k}::48067\n" for k, (u, (g, _, _)) in enumerate(USERS.items()))
    )
    (d / "movies.dat").write_bytes(
        "".join(f"{i}::Amélie ({i})::{'|'.join(gs)}\n" for i, gs in GENRES.items()).encode("latin-1")
    )
    return d


def _ml25m(d: Path) -> Path:
    d.mkdir()
    (d / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n"
        + "".join(f"{u},{i},{r - 0.5 if r == 5 else float(r)},{t}\n" for u, i, r, t in RATINGS)
    )
    rows = [f'{i},"Title, The ({i})",{"|".join(gs) or "(no genres listed)"}\n' for i, gs in GENRES.items()]
    (d / "movies.csv").write_text("movieId,title,genres\n" + "".join(rows))
    return d


@pytest.mark.parametrize("make", [_ml100k, _ml1m, _ml25m])
def test_reader_values(tmp_path: Path, make) -> None:  # noqa: ANN001
    data = read_movielens(make(tmp_path / "ml"))
    assert len(data) == 6 and data.skipped_lines == 0
    assert data.raw_user_ids.tolist() == [10, 20, 30] and data.raw_item_ids.tolist() == [100, 200, 300]
    assert data.user.tolist() == [1, 1, 2, 3, 2, 3] and data.item.tolist() == [1, 2, 1, 3, 3, 1]
    assert data.timestamp.tolist() == [t for *_, t in RATINGS]
    assert data.genre_names == ["Animation", "Comedy", "Drama"]
    genres_of = lambda k: data.genre_values[data.genre_offsets[k] : data.genre_offsets[k + 1]].tolist()  # noqa: E731
    assert genres_of(1) == [1, 2] and genres_of(2) == [3] and genres_of(3) == []
    assert (
        data.num_embeddings["userId"] == 4
        and data.num_embeddings["movieId"] == 4
        and data.num_embeddings["genres"] == 4
    )
    if make is _ml25m:
        assert data.rating.tolist() == [4.5, 3, 4, 1, 4, 2] and data.user_features == {}
    else:
        assert data.rating.tolist() == [5, 3, 4, 1, 4, 2]
        assert data.user_features["gender"].tolist() == [0, 2, 1, 2]  # vocab F=1, M=2; row 0 = unknown
        ages = data.user_features["age"].tolist()
        assert ages[1] != ages[2] != ages[3] and 0 not in ages[1:]


def test_ctr_batch_layout(tmp_path: Path) -> None:
    data = read_movielens(_ml100k(tmp_path / "ml"))
    ds = MovieLensDataset(data, np.array([0, 1, 3]), batch_size=3)
    b = ds[0]
    kjt = b.sparse_features
    assert kjt.keys() == ["userId", "gender", "age", "occupation", "movieId", "genres"]
    assert kjt["userId"].values().tolist() == [1, 1, 3]
    assert kjt["movieId"].values().tolist() == [1, 2, 3]
    assert kjt["genres"].lengths().tolist() == [2, 1, 0] and kjt["genres"].values().tolist() == [1, 2, 3]
    torch.testing.assert_close(b.labels, torch.tensor([1.0, 0.0, 0.0]))  # rating >= 4
    assert b.dense_features.shape == (3, 0)
    assert [c.name for c in ds.table_configs(4)][:2] == ["t_userId", "t_gender"]
    assert ds.table_configs(4)[-1].num_embeddings == 4
    raw = MovieLensDataset(data, np.arange(6), batch_size=4, label_threshold=None)
    assert len(raw) == 1 and raw[0].labels.tolist() == [5, 3, 4, 1]


def test_datamodule_ctr_and_retrieval_splits(tmp_path: Path) -> None:
    d = _ml1m(tmp_path / "ml")
    dm = MovieLensDataModule(
        str(d), task="ctr", batch_size=1, val_fraction=1 / 6, test_fraction=1 / 6, split="time"
    )
    dm.setup()
    order = np.argsort([t for *_, t in RATINGS], kind="stable")  # time split: oldest first
    assert dm.datasets["train"].rows.tolist() == order[:4].tolist()
    assert dm.datasets["test"].rows.tolist() == order[5:].tolist()
    assert len(dm.train_dataloader()) == 4
    rt = MovieLensDataModule(str(d), task="retrieval", batch_size=1, val_fraction=0.0, test_fraction=0.0)
    rt.setup()
    pairs = sorted(rt.datasets["train"].rows.tolist())
    assert pairs == [0, 2, 4]  # ratings >= 4 only
    assert sorted(b.labels.item() for b in rt.train_dataloader()) == [4.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="task must be"):
        MovieLensDataModule(str(d), task="rank")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "file", "corrupt", "reason"),
    [
        (_ml100k, "u.data", lambda s: s.replace("20\t100\t4", "20\t100"), "u.data:3: wrong column count"),
        (_ml1m, "ratings.dat", lambda s: s.replace("30::300::1", "30::x::1"), "ratings.dat:4: non-numeric"),
        (
            _ml25m,
            "ratings.csv",
            lambda s: s.replace("20,300,4.0", "20,300,four"),
            "ratings.csv:6: non-numeric",
        ),
        (_ml25m, "ratings.csv", lambda s: s.rstrip("\n")[:-3], "ratings.csv:7: truncated line"),
        (
            _ml25m,
            "movies.csv",
            lambda s: s.replace(",Drama", ",Drama,extra"),
            "movies.csv:3: wrong column count",
        ),
    ],
)
def test_malformed_lines(tmp_path: Path, make, file: str, corrupt, reason: str) -> None:  # noqa: ANN001
    d = make(tmp_path / "ml")
    path = d / file
    path.write_text(corrupt(path.read_text(encoding="latin-1")), encoding="latin-1")
    with pytest.raises(DataFormatError, match=reason):
        read_movielens(d)
    data = read_movielens(d, on_error="skip")
    assert data.skipped_lines == 1


def test_missing_folder_message(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="u.data for ml-100k"):
        read_movielens(tmp_path)
