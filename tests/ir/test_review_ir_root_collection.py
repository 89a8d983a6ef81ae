"""A collection exported by itself (the program's root, not a submodule of a model): the documented
round trip -- encapsulate, export with ``preserve_module_call_signature=tuple(fqns)`` and a dynamic
batch size, save, load, unflatten, decapsulate -- gives the eager collection back, with its keys,
pooling and weights, computing what the original computes on another batch size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lightrec.ir.utils import decapsulate_ir_modules, encapsulate_ir_modules, mark_dynamic_kjt
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.sparse import KeyedJaggedTensor

KEYS = ["b", "a", "c"]  # not in table order: the outputs follow the tables' feature order


def _kjt(size: int, seed: int, weighted: bool = False) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(KEYS) * size,), generator=g)
    lengths[0] = 2  # at least 2 ids (torch.export specializes 0 and 1)
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.shape, generator=g) if weighted else None
    return KeyedJaggedTensor(KEYS, values, weights=weights, lengths=lengths)


def _collection(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "ec":
        return EmbeddingCollection([
            EmbeddingConfig(name="t1", num_embeddings=7, embedding_dim=3, feature_names=["b"]),
            EmbeddingConfig(name="t0", num_embeddings=9, embedding_dim=3, feature_names=["a", "c"]),
        ])  # fmt: skip
    return EmbeddingBagCollection([
        EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=3, feature_names=["b"], pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="t0", num_embeddings=9, embedding_dim=5, feature_names=["a", "c"]),
    ], is_weighted=kind == "weighted-ebc")  # fmt: skip


def _reference(module: nn.Module, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
    """Plain-torch lookups of ``module``'s tables: ``{feature: pooled [B, D]}`` or ``{feature: rows [n, D]}``."""
    tables = {n: p.detach() for n, p in module.named_parameters()}
    out = {}
    for feature, jt in kjt.to_dict().items():
        (name,) = [n for n in tables if f".{_table_of(feature)}." in f".{n}"]
        rows = tables[name][jt.values()]
        if isinstance(module, EmbeddingCollection):
            out[feature] = rows
            continue
        weights = jt.weights() if jt.weights_or_none() is not None else torch.ones(len(rows))
        bags = torch.repeat_interleave(torch.arange(len(jt.lengths())), jt.lengths())
        pooled = torch.zeros(len(jt.lengths()), rows.shape[1]).index_add_(0, bags, rows * weights[:, None])
        if feature == "b":  # t1 pools by MEAN
            pooled = pooled / jt.lengths().clamp(min=1)[:, None]
        out[feature] = pooled
    return out


def _table_of(feature: str) -> str:
    return "t1" if feature == "b" else "t0"


def _outputs(result: object) -> dict[str, torch.Tensor]:
    if isinstance(result, dict):  # EmbeddingCollection: {feature: JaggedTensor}
        return {k: v.values() for k, v in result.items()}
    return dict(result.to_dict())  # KeyedTensor


@pytest.mark.parametrize("kind", ["ebc", "weighted-ebc", "ec"])
def test_a_collection_exported_by_itself_round_trips(kind: str, tmp_path: Path) -> None:
    original = _collection(kind)
    example, other = _kjt(4, 1, kind == "weighted-ebc"), _kjt(7, 2, kind == "weighted-ebc")
    expected = original(other)
    module, fqns = encapsulate_ir_modules(original)
    shapes = mark_dynamic_kjt(example, variable_batch=True)
    program = torch.export.export(
        module, (example,), dynamic_shapes=shapes.dynamic_shapes(module, (example,)), strict=False,
        preserve_module_call_signature=tuple(fqns),
    )  # fmt: skip
    assert fqns == []  # the program's own signature; torch.export refuses "" as a preserved name
    path = tmp_path / "collection.pt2"
    torch.export.save(program, str(path))
    loaded = torch.export.load(str(path))
    rebuilt = decapsulate_ir_modules(torch.export.unflatten(loaded))
    assert type(rebuilt) is type(original)
    for name, p in original.named_parameters():
        assert torch.equal(dict(rebuilt.named_parameters())[name], p), name
    reference = _reference(original, other)
    for got in (rebuilt(other), loaded.module()(other)):
        if not isinstance(got, dict):
            assert got.keys() == expected.keys() == ["b", "a", "c"]
            assert got.length_per_key() == expected.length_per_key()
        outputs = _outputs(got)
        assert list(outputs) == list(_outputs(expected))
        for feature, want in reference.items():
            torch.testing.assert_close(outputs[feature], want, rtol=1e-6, atol=1e-6)
