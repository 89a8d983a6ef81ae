"""MovieLens readers (ml-100k, ml-1m, ml-20m, ml-25m): one release as :class:`MovieLensData`.

Files read (``data_dir`` is the unpacked archive folder)::

    ml-100k   u.data  "user \\t item \\t rating \\t ts"     u.user "user|age|gender|occupation|zip"
              u.item  "item|title|date|video date|url|19 genre flags"                  (latin-1)
    ml-1m     ratings.dat "user::item::rating::ts"  users.dat "user::gender::age::occupation::zip"
              movies.dat  "item::title::Genre1|Genre2"                                  (latin-1)
    ml-20m/25m ratings.csv "userId,movieId,rating,timestamp"  movies.csv "movieId,title,genres" (header)

A ratings file's first line is a header when its first field is not an integer (detected, not
assumed: a ``ratings.csv`` without one keeps its first rating); ``movies.csv``'s likewise when its
first field is a column name (``movieId``: letters only), so a file without one keeps its first movie.
Rows with ids below 1 or a rating that is not a number from 0.5 to 5 are malformed lines under the
reader's ``on_error`` policy.

Ids are renumbered densely from 1 (``0`` = unknown/padding), so a feature's table has
``num_embeddings[feature]`` rows. :class:`~lightrec.data.MovieLensDataset`
(:mod:`lightrec.data.movielens.dataset`) cuts the interactions into batches.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lightrec.data.errors import DataFormatError, DatasetNotFoundError, LineErrors, OnError

__all__ = ["ML100K_GENRES", "MOVIELENS_URL", "MovieLensData", "detect_variant", "genres_csr", "read_movielens"]

logger = logging.getLogger(__name__)

MOVIELENS_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
"""Where ml-100k is downloaded (ml-1m / ml-20m / ml-25m: the same folder, their own zip)."""

ML100K_GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
]  # fmt: skip
# ml-1m age codes; ml-100k raw ages are bucketed into the same groups.
_AGE_BUCKETS = [1, 18, 25, 35, 45, 50, 56]


@dataclass
class MovieLensData:
    """All interactions of one MovieLens release, ids renumbered from 1.

    Attributes:
        user, item: ``[N]`` int64 dense ids.   rating: ``[N]`` float32.   timestamp: ``[N]`` int64.
        genre_offsets / genre_values: CSR of genre ids per item id (``offsets`` has ``num_items + 2``
            entries, row ``i`` is item id ``i``).
        user_features: ``{name: [num_users + 1] int64}`` side features per user id (may be empty).
        num_embeddings: rows per sparse feature, id 0 included.
        raw_user_ids / raw_item_ids: original id of dense id ``k`` at position ``k - 1``.
        skipped_lines: malformed lines skipped under ``on_error="skip"``.
    """

    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray
    timestamp: np.ndarray
    genre_offsets: np.ndarray
    genre_values: np.ndarray
    genre_names: list[str]
    raw_user_ids: np.ndarray
    raw_item_ids: np.ndarray
    user_features: dict[str, np.ndarray] = field(default_factory=dict)
    num_embeddings: dict[str, int] = field(default_factory=dict)
    skipped_lines: int = 0

    def __len__(self) -> int:
        return int(self.user.shape[0])


def genres_csr(per_item: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(genre_offsets, genre_values)`` of :class:`MovieLensData` from the genre ids of items ``1..n``.

    ``per_item[k]`` lists the genres of item id ``k + 1``; row 0 (the padding id) is empty, so
    ``offsets`` has ``n + 2`` entries and item ``i``'s genres are ``values[offsets[i]:offsets[i + 1]]``.
    """
    offsets = np.zeros(len(per_item) + 2, dtype=np.int64)
    offsets[2:] = np.cumsum([len(g) for g in per_item])
    return offsets, np.array([g for gs in per_item for g in gs], dtype=np.int64)


def detect_variant(data_dir: str | Path) -> str:
    """``"100k"``, ``"1m"`` or ``"csv"`` (20m/25m) from the files in ``data_dir``."""
    d = Path(data_dir)
    for name, variant in (("u.data", "100k"), ("ratings.dat", "1m"), ("ratings.csv", "csv")):
        if (d / name).is_file():
            return variant
    raise DatasetNotFoundError(
        str(d),
        f"{str(d)!r} holds no MovieLens ratings file (u.data for ml-100k, ratings.dat for ml-1m, "
        "ratings.csv for ml-20m/ml-25m); point data_dir at the unpacked archive folder.",
        MOVIELENS_URL,
        "unzip it, e.g. into data/ml-100k; leave data_dir unset for the built-in synthetic MovieLens set",
    )


#: A UTF-8 byte order mark, which editors and Excel put at the start of a file they save.
_BOM = b"\xef\xbb\xbf"


def _read_text(path: Path, encoding: str) -> str:
    """The file's text without a leading UTF-8 byte order mark (in any ``encoding``: ``latin-1``
    would read it as three characters glued to the first id)."""
    data = path.read_bytes()
    return data[len(_BOM) :].decode(encoding) if data.startswith(_BOM) else data.decode(encoding)


def _lines(path: Path, encoding: str) -> list[str]:
    """The file's lines, each with its newline (a last one may lack it). Lines end at ``\n`` only
    (``\r\n`` too): ``str.splitlines`` would also cut a line at a form feed or at ``\x85``, a
    byte that a latin-1 title may hold."""
    parts = _read_text(path, encoding).split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _split_rows(
    path: Path, sep: str, ncols: int, errors: LineErrors, encoding: str = "latin-1", skip: int = 0
) -> tuple[list[tuple[int, list[str]]], int | None]:
    """``(line number, fields)`` of every line with ``ncols`` fields, and the number of a last line
    that lacks its newline (``None`` if the file ends properly)."""
    lines = _lines(path, encoding)
    cut = len(lines) if lines and not lines[-1].endswith("\n") else None
    out = []
    for i, line in enumerate(lines[skip:], start=1 + skip):
        fields = line.rstrip("\r\n").split(sep)
        if i == cut:  # even with the right column count: its last field may be cut short
            errors.bad_line(str(path), i, TRUNCATED)
            continue
        if len(fields) != ncols:
            errors.bad_line(
                str(path), i, f"wrong column count: expected {ncols} {sep!r}-separated fields, got {len(fields)}"
            )
            continue
        out.append((i, fields))
    return out, cut


#: A last line without its newline: every MovieLens file ends with one, so the file was cut there.
TRUNCATED = (
    "truncated line (no newline at end of file): the file looks cut off here (an interrupted download or "
    "copy?), and the line's last field may be cut short (a wrong timestamp or rating); download the data set "
    "again, or add the newline if the line is complete"
)

#: Accepted values (MovieLens ids start at 1; ratings are 0.5 to 5 stars); other rows are bad lines.
RATING_RANGE = (0.5, 5.0)


def _has_header(path: Path, sep: str) -> bool:
    """True when the first line is a header: its first field is not an integer id."""
    with open(path, encoding="utf-8-sig", errors="replace") as fh:  # -sig: a BOM is no header
        first = fh.readline()
    head = first.split(sep, 1)[0].strip()
    try:
        int(head)
    except ValueError:
        return bool(first.strip())
    return False


def _is_movies_header(fields: list[str]) -> bool:
    """True when the first row of a ``movies.csv`` is its header (``movieId,title,genres``): its first
    field is a column name (letters and ``_``). A file without a header keeps its first movie, and a
    mistyped id (``x10``) stays a malformed line."""
    name = fields[0].strip() if fields else ""
    return bool(name) and name.replace("_", "").isalpha()


def _check_ranges(arr: np.ndarray, linenos: np.ndarray, path: Path, errors: LineErrors) -> np.ndarray:
    """Rows whose ids are >= 1 and rating is finite and within ``RATING_RANGE``; others are bad lines."""
    lo, hi = RATING_RANGE
    rating = arr["r"]
    bad = (arr["u"] < 1) | (arr["i"] < 1) | ~np.isfinite(rating) | (rating < lo) | (rating > hi)
    for k in np.flatnonzero(bad)[: None if errors.on_error == "skip" else 1]:
        row = arr[k]
        if row["u"] < 1 or row["i"] < 1:
            reason = f"user and item ids must be >= 1, got user {int(row['u'])}, item {int(row['i'])}"
        else:
            reason = f"rating must be a number from {lo} to {hi}, got {float(row['r'])}"
        errors.bad_line(str(path), int(linenos[k]), reason)
    return arr[~bad]


def _read_ratings(path: Path, sep: str, errors: LineErrors) -> np.ndarray:
    """Ratings as a structured array (user, item, rating, ts); a header line is detected, not assumed."""
    dtype = [("u", "i8"), ("i", "i8"), ("r", "f4"), ("t", "i8")]
    header = _has_header(path, sep)
    if sep == "," and errors.on_error == "raise":
        try:  # fast C parser; any problem falls back to the line parser, which names the line
            arr = np.loadtxt(
                path, delimiter=",", skiprows=1 if header else 0, dtype=dtype, ndmin=1, comments=None,
                encoding="utf-8-sig",
            )
            lines, last = _count_lines(path)
            # loadtxt passes over blank lines: then a row's line number is not its index, and the
            # line parser (which names a blank line as malformed, as on_error="skip" counts it) judges
            if last in (b"\n", b"") and len(arr) == lines - int(header):  # and the last line
                return _check_ranges(arr, np.arange(len(arr)) + 1 + int(header), path, errors)
        except (ValueError, IndexError):
            pass
    rows, linenos = [], []
    split, _ = _split_rows(path, sep, 4, errors, "utf-8", skip=1 if header else 0)
    for lineno, f in split:
        try:
            rows.append((int(f[0]), int(f[1]), float(f[2]), int(float(f[3]))))
            linenos.append(lineno)
        except ValueError:
            errors.bad_line(str(path), lineno, f"non-numeric user/item/rating/timestamp in {f!r}")
    return _check_ranges(np.array(rows, dtype=dtype).reshape(-1), np.array(linenos, dtype=np.int64), path, errors)


def _count_lines(path: Path) -> tuple[int, bytes]:
    """``(number of newlines, last byte)`` of a file, read in blocks."""
    count, last = 0, b""
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            count += block.count(b"\n")
            last = block[-1:]
    return count, last


def _age_bucket(age: int) -> int:
    return max(b for b in _AGE_BUCKETS if age >= b) if age >= 18 else 1


def _read_users(path: Path, variant: str, errors: LineErrors) -> dict[int, tuple[str, int, str]]:
    """``{raw user id: (gender, age bucket, occupation)}``."""
    sep, ncols = ("|", 5) if variant == "100k" else ("::", 5)
    users = {}
    for lineno, f in _split_rows(path, sep, ncols, errors)[0]:
        try:
            if variant == "100k":
                users[int(f[0])] = (f[2], _age_bucket(int(f[1])), f[3])
            else:
                users[int(f[0])] = (f[1], int(f[2]), f[3])
        except ValueError:
            errors.bad_line(str(path), lineno, f"non-numeric user id or age in {f!r}")
    return users


def _read_movies(path: Path, variant: str, errors: LineErrors) -> dict[int, list[str]]:
    """``{raw item id: [genre names]}``."""
    movies: dict[int, list[str]] = {}
    if variant == "100k":
        for lineno, f in _split_rows(path, "|", 5 + len(ML100K_GENRES), errors)[0]:
            try:
                movies[int(f[0])] = [
                    g for g, flag in zip(ML100K_GENRES, f[5:], strict=True) if int(flag) == 1
                ]
            except ValueError:
                errors.bad_line(str(path), lineno, f"non-numeric movie id or genre flag in {f[:1] + f[5:]!r}")
        return movies
    if variant == "1m":
        rows = _split_rows(path, "::", 3, errors)[0]
    else:
        text = _read_text(path, "utf-8")
        reader = csv.reader(io.StringIO(text, newline=""))
        rows = []
        for f in reader:
            if reader.line_num == 1 and _is_movies_header(f):
                continue
            if not text.endswith("\n") and reader.line_num == text.count("\n") + 1:
                errors.bad_line(str(path), reader.line_num, TRUNCATED)
                continue
            if len(f) != 3:
                errors.bad_line(
                    str(path),
                    reader.line_num,
                    f"wrong column count: expected 3 comma-separated fields, got {len(f)}",
                )
                continue
            rows.append((reader.line_num, f))
    for lineno, f in rows:
        try:
            movies[int(f[0])] = [g for g in f[2].split("|") if g and g != "(no genres listed)"]
        except ValueError:
            errors.bad_line(str(path), lineno, f"non-numeric movie id {f[0]!r}")
    return movies


def read_movielens(data_dir: str | Path, on_error: OnError = "raise") -> MovieLensData:
    """Read one MovieLens release (variant detected from the file names).

    Args:
        data_dir: unpacked ``ml-100k``, ``ml-1m``, ``ml-20m`` or ``ml-25m`` folder.
        on_error: ``"raise"`` a ``DataFormatError`` (file:line) at the first malformed line, or
            ``"skip"`` malformed lines and count them in ``skipped_lines``.
    """
    d = Path(data_dir)
    variant = detect_variant(d)
    errors = LineErrors(on_error)
    files = {
        "100k": ("u.data", "u.user", "u.item"),
        "1m": ("ratings.dat", "users.dat", "movies.dat"),
        "csv": ("ratings.csv", None, "movies.csv"),
    }[variant]
    sep = {"100k": "\t", "1m": "::", "csv": ","}[variant]
    ratings = _read_ratings(d / files[0], sep, errors)
    if len(ratings) == 0:  # nothing to train on: 0 batches would end the run silently
        what = (
            f"all {errors.skipped} lines were skipped as malformed (on_error='skip')" if errors.skipped
            else "the file is empty (or holds only a header)"
        )
        raise DataFormatError(
            str(d / files[0]), 0, f"holds no ratings: {what}; point data_dir at a complete MovieLens folder"
        )
    movies = _read_movies(d / files[2], variant, errors) if (d / files[2]).is_file() else {}
    users = _read_users(d / files[1], variant, errors) if files[1] and (d / files[1]).is_file() else {}
    errors.log_summary(str(d))

    raw_users, user = np.unique(ratings["u"], return_inverse=True)
    raw_items, item = np.unique(
        np.concatenate([ratings["i"], np.fromiter(movies, dtype=np.int64, count=len(movies))]),
        return_inverse=True,
    )
    item = item[: len(ratings)]
    genre_names = sorted({g for gs in movies.values() for g in gs})
    gid = {g: k + 1 for k, g in enumerate(genre_names)}
    per_item = [[gid[g] for g in movies.get(int(raw), [])] for raw in raw_items]
    genre_offsets, genre_values = genres_csr(per_item)

    user_features: dict[str, np.ndarray] = {}
    if users:
        for k, name in enumerate(("gender", "age", "occupation")):
            vocab = {v: j + 1 for j, v in enumerate(sorted({u[k] for u in users.values()}, key=str))}
            col = np.zeros(len(raw_users) + 1, dtype=np.int64)
            col[1:] = [vocab[users[int(r)][k]] if int(r) in users else 0 for r in raw_users]
            user_features[name] = col
    num_embeddings = {
        "userId": len(raw_users) + 1,
        "movieId": len(raw_items) + 1,
        "genres": len(genre_names) + 1,
    }
    for name, col in user_features.items():
        num_embeddings[name] = int(col.max()) + 1
    return MovieLensData(
        user=user.astype(np.int64) + 1,
        item=item.astype(np.int64) + 1,
        rating=ratings["r"].astype(np.float32),
        timestamp=ratings["t"].astype(np.int64),
        genre_offsets=genre_offsets,
        genre_values=genre_values,
        genre_names=genre_names,
        raw_user_ids=raw_users,
        raw_item_ids=raw_items,
        user_features=user_features,
        num_embeddings=num_embeddings,
        skipped_lines=errors.skipped,
    )
