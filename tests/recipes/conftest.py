"""Fixtures for recipe tests: tiny data in the real formats, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipes.helpers import write_criteo_kaggle, write_ml100k


@pytest.fixture(scope="session")
def movielens_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ml100k(tmp_path_factory.mktemp("ml-100k"))


@pytest.fixture(scope="session")
def criteo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightrec.data import preprocess_criteo

    root = tmp_path_factory.mktemp("criteo")
    raw = write_criteo_kaggle(root / "train.txt")
    preprocess_criteo([raw], root / "preprocessed", num_embeddings_cap=200, progress=False)
    return root / "preprocessed"
