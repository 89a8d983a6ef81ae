"""Small generated inputs for recipe tests: a MovieLens-100k folder with a learnable signal."""

from __future__ import annotations

from pathlib import Path

import numpy as np

GENRES = 19  # ml-100k's genre flag columns


def write_ml100k(folder: Path, users: int = 60, items: int = 80, ratings: int = 4000, seed: int = 0) -> Path:
    """Write ``u.data``, ``u.user``, ``u.item`` in the real ml-100k formats; returns ``folder``.

    Users like items whose (hidden) group matches theirs, so CTR and retrieval models can learn.
    """
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    user_group = rng.integers(0, 4, users + 1)
    item_group = rng.integers(0, 4, items + 1)
    lines = []
    for k in range(ratings):
        u, i = int(rng.integers(1, users + 1)), int(rng.integers(1, items + 1))
        good = user_group[u] == item_group[i]
        r = int(rng.integers(4, 6)) if good or rng.random() < 0.15 else int(rng.integers(1, 4))
        lines.append(f"{u}\t{i}\t{r}\t{880000000 + k}\n")
    (folder / "u.data").write_text("".join(lines))
    occupations = ["artist", "doctor", "engineer", "student"]
    (folder / "u.user").write_text(
        "".join(
            f"{u}|{int(rng.integers(15, 70))}|{'MF'[u % 2]}|{occupations[u % 4]}|{10000 + u}\n"
            for u in range(1, users + 1)
        )
    )
    item_lines = []
    for i in range(1, items + 1):
        flags = ["0"] * GENRES
        flags[1 + item_group[i]] = "1"
        flags[int(rng.integers(0, GENRES))] = "1"
        item_lines.append(f"{i}|Movie {i} (1995)|01-Jan-1995||http://x/{i}|" + "|".join(flags) + "\n")
    (folder / "u.item").write_text("".join(item_lines), encoding="latin-1")
    return folder


def write_criteo_kaggle(path: Path, rows: int = 600, seed: int = 0) -> Path:
    """A Criteo Kaggle ``train.txt`` (label, 13 ints, 26 hex categoricals, tab-separated, blanks allowed)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        dense = ["" if rng.random() < 0.2 else str(int(rng.integers(0, 300))) for _ in range(13)]
        cats = [
            "" if rng.random() < 0.1 else format(int(rng.integers(0, 50)) * 7919, "08x") for _ in range(26)
        ]
        label = str(int(rng.random() < 0.3))
        lines.append("\t".join([label, *dense, *cats]) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path
