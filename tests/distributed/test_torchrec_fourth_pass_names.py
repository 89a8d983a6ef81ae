"""torchrec's names of issue 37 still missing after the third pass, at torchrec's paths, each used
the way torchrec's callers use it on a small case against a hand-computed or plain-PyTorch reference."""

from __future__ import annotations

import importlib

import pytest

NAMES = {
    "lightrec.distributed.embedding_lookup": ["GroupedPooledEmbeddingsLookup", "GroupedEmbeddingsLookup"],
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(NAMES))
def test_each_name_imports_at_torchrecs_path(path: str) -> None:
    module = importlib.import_module(path)
    assert not [name for name in NAMES[path] if not hasattr(module, name)]


def test_embedding_lookup_re_exports_lightrecs_grouped_lookups() -> None:
    from lightrec.distributed import embedding_lookup
    from lightrec.distributed.sharding import lookups

    assert embedding_lookup.GroupedPooledEmbeddingsLookup is lookups.GroupedPooledEmbeddingsLookup
    assert embedding_lookup.GroupedEmbeddingsLookup is lookups.GroupedEmbeddingsLookup
    assert issubclass(lookups.GroupedPooledEmbeddingsLookup, lookups.GroupedLookup)
