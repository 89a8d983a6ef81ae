"""Quantized tables against a plain-PyTorch reference written from the documented row layout.

The reference decodes every stored row as the module docstrings lay it out (``lightrec.quant.row_codec``)::

    int8   | scale fp16 | bias fp16 | q_0 ... q_{D-1}                     | pad |
    int4   | scale fp16 | bias fp16 | (q_0 | q_1 << 4) ... D/2 bytes       | pad |
    fp16   | x_0 ... x_{D-1}                                              | pad |

(value = q * scale + bias) and pools the decoded rows in float32, as torchrec's quantized collections
promise. Covered: every row format with int32 ids, empty bags, weights and MEAN; rows fp16 cannot
hold; special rows against the documented error bound; the bounds_check modes; odd int4 dims (refused,
as fbgemm's IntN TBE module refuses them).
"""

from __future__ import annotations

import pytest
import torch

import lightrec
from lightrec.inference import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.sparse import KeyedJaggedTensor
from tests.inference.helpers import kernel_params

KERNELS = kernel_params()


def _decode(stored: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    """``[rows, dim]`` float32 from stored rows, read byte by byte from the documented layout."""
    if kind == "fp16":
        return stored[:, : 2 * dim].contiguous().view(torch.float16).float()
    scale = stored[:, 0:2].contiguous().view(torch.float16).float()
    bias = stored[:, 2:4].contiguous().view(torch.float16).float()
    codes = torch.zeros(stored.shape[0], dim)
    for d in range(dim):
        if kind == "int8":
            codes[:, d] = stored[:, 4 + d].float()
        else:
            byte = stored[:, 4 + d // 2].long()
            codes[:, d] = ((byte >> 4) if d % 2 else (byte & 15)).float()
    return codes * scale + bias


def _pool(table: torch.Tensor, ids: list[int], weights: list[float] | None, mean: bool) -> torch.Tensor:
    acc = torch.zeros(table.shape[1])
    for i, row in enumerate(ids):
        acc = acc + table[row] * (1.0 if weights is None else weights[i])
    return acc / len(ids) if mean and ids else acc


def _bound(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """The documented per-row error bound (docs/serving.md, "Quantized tables")."""
    lo, hi = weight.min(1).values, weight.max(1).values
    if kind == "fp16":
        return weight.abs().max(1).values * 2.0**-11 + 2.0**-24
    qmax = 255 if kind == "int8" else 15
    return (hi - lo) / qmax / 2 * (1 + 2.0**-10) + 2.0**-10 * (hi - lo + lo.abs()) + 2.0**-24


# ---------------------------------------------------------------------------------- odd int4 dims


@pytest.mark.parametrize("cls,config", [(QuantEmbeddingBagCollection, EmbeddingBagConfig),
                                        (QuantEmbeddingCollection, EmbeddingConfig)], ids=["bag", "sequence"])
@pytest.mark.parametrize("dim", [1, 3, 7])
def test_int4_table_with_odd_dim_is_refused_before_anything_is_stored(cls: type, config: type, dim: int) -> None:
    # fbgemm's IntN TBE module (torchrec's) only packs int4 at byte granularity: an even dim
    tables = [config(name="even", num_embeddings=4, embedding_dim=4, feature_names=["e"]),
              config(name="odd", num_embeddings=4, embedding_dim=dim, feature_names=["o"])]
    with pytest.raises(ValueError, match=f"'odd' has embedding_dim={dim}.*even embedding_dim.*int8"):
        cls(tables, dtype="int4")
    stored = cls(tables, dtype="int4", per_table={"odd": "int8"})  # the fix the message gives
    configs = stored.embedding_bag_configs() if cls is QuantEmbeddingBagCollection else stored.embedding_configs()
    assert [t.data_type for t in configs] == [DataType.INT4, DataType.INT8]


# ------------------------------------------------------------------------- every format (regressions)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
@pytest.mark.parametrize("dim", [2, 6, 12])
def test_every_format_pools_its_decoded_rows_with_int32_ids_and_empty_bags(kernel: str, kind: str, dim: int) -> None:
    torch.manual_seed(dim)
    tables = [
        EmbeddingBagConfig(name="s", num_embeddings=7, embedding_dim=dim, feature_names=["a", "b"]),
        EmbeddingBagConfig(name="m", num_embeddings=5, embedding_dim=4, feature_names=["c"], pooling=PoolingType.MEAN),
    ]
    ebc = lightrec.EmbeddingBagCollection(tables, is_weighted=True)
    q = QuantEmbeddingBagCollection.from_float(ebc, dtype=kind, kernel_backend=kernel)
    assert {k: tuple(v.shape) for k, v in q.state_dict().items()} == {
        "embedding_bags.s.weight": (7, 16 if kind != "fp16" or dim < 12 else 32),
        "embedding_bags.m.weight": (5, 16),
    }
    ids = [1, 6, 0, 2, 3, 4, 4, 0, 1]
    lengths = [2, 0, 3, 1, 0, 0, 1, 2, 0]
    weights = [0.5, 1.0, 2.0, -1.0, 0.25, 3.0, 1.0, 0.5, 2.0]
    batch = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.tensor(ids, dtype=torch.int32),
                              lengths=torch.tensor(lengths, dtype=torch.int32), weights=torch.tensor(weights))
    out = q(batch).to_dict()
    decoded = {"s": _decode(q.embedding_bags["s"].weight, kind, dim), "m": _decode(q.embedding_bags["m"].weight, kind, 4)}
    start = 0
    for f, (key, table, mean) in enumerate([("a", "s", False), ("b", "s", False), ("c", "m", True)]):
        expected = []
        for b in range(3):
            n = lengths[3 * f + b]
            expected.append(_pool(decoded[table], ids[start : start + n], weights[start : start + n], mean))
            start += n
        assert out[key].dtype == torch.float32
        torch.testing.assert_close(out[key], torch.stack(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
def test_special_rows_decode_within_the_documented_bound(kind: str) -> None:
    rows = torch.tensor([
        [0.5] * 8,  # all equal: scale 0 -> stored 1, every code 0
        [-3.0] * 8,
        [1e-3, -1e-3, 5e-4, 0.0, 0.0, 0.0, 0.0, 1e-3],  # an fp16-subnormal scale
        [1e-8] * 4 + [2e-8] * 4,  # below fp16's smallest subnormal
        [65504.0, -65504.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],  # fp16's whole range
    ])
    ebc = lightrec.EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=8,
                                                              feature_names=["f"])])
    with torch.no_grad():
        ebc.embedding_bags["t"].weight.copy_(rows)
    q = QuantEmbeddingBagCollection.from_float(ebc, dtype=kind, kernel_backend="torch")
    decoded = _decode(q.embedding_bags["t"].weight, kind, 8)
    assert bool(((decoded - rows).abs().max(1).values <= _bound(rows, kind)).all())
    if kind != "fp16":
        assert torch.equal(decoded[:2], rows[:2])  # equal rows come back exactly
    out = q(KeyedJaggedTensor(keys=["f"], values=torch.arange(5), lengths=torch.ones(5, dtype=torch.long)))
    torch.testing.assert_close(out.values(), decoded, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 70000.0])
def test_rows_fp16_cannot_hold_are_refused_naming_the_table(bad: float) -> None:
    ebc = lightrec.EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=3, embedding_dim=4,
                                                              feature_names=["f"])])
    with torch.no_grad():
        ebc.embedding_bags["t"].weight[1, 2] = bad
    with pytest.raises(ValueError, match="table 't'"):
        QuantEmbeddingBagCollection.from_float(ebc, dtype="int8")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["clamp", "skip"])
def test_out_of_range_ids_follow_bounds_check(kernel: str, mode: str) -> None:
    torch.manual_seed(0)
    ebc = lightrec.EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=4,
                                                              feature_names=["f"])])
    q = QuantEmbeddingBagCollection(ebc.embedding_bag_configs(), bounds_check=mode, kernel_backend=kernel)
    q.set_float_weight("t", ebc.embedding_bags["t"].weight)
    table = _decode(q.embedding_bags["t"].weight, "int8", 4)
    out = q(KeyedJaggedTensor(keys=["f"], values=torch.tensor([0, 7, -1], dtype=torch.int32),
                              lengths=torch.tensor([2, 1], dtype=torch.int32))).values()
    expected = [table[0] + table[4], table[0]] if mode == "clamp" else [table[0], torch.zeros(4)]
    torch.testing.assert_close(out, torch.stack(expected), rtol=1e-6, atol=1e-6)
    strict = QuantEmbeddingBagCollection(ebc.embedding_bag_configs(), kernel_backend=kernel)
    with pytest.raises(IndexError, match="id 7 but table 't' has 5 rows"):
        strict(KeyedJaggedTensor(keys=["f"], values=torch.tensor([0, 7]), lengths=torch.tensor([1, 1])))
