"""Loading a quantized collection's state dict into one whose tables store another row format (review).

An int4 and an int8 table of the same width often have the same ``row_bytes`` (``D = 8``: 16 bytes
each with the default alignment of 16), so the ``uint8`` buffers alone load without a size error
and the bytes are misread. The state dict's metadata records each table's format; a load of rows
in another format raises ``QuantRowFormatError`` naming the table and both formats, before any table
is written. The row codec's round trips (zeros, constant rows, NaN / inf) are checked against exact
values.
"""

from __future__ import annotations

import io

import pytest
import torch

import lightrec
from lightrec.modules import EmbeddingBagConfig, EmbeddingConfig
from lightrec.modules.embedding_configs import DataType
from lightrec.quant.collection_base import QuantRowFormatError
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from lightrec.quant.row_codec import dequantize_rows, quantize_rows, row_size_in_bytes


def _bag_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="a", num_embeddings=6, embedding_dim=8, feature_names=["x"]),
        EmbeddingBagConfig(name="b", num_embeddings=5, embedding_dim=8, feature_names=["y"]),
    ]


def _quantized(per_table: dict[str, object]) -> QuantEmbeddingBagCollection:
    torch.manual_seed(0)
    return QuantEmbeddingBagCollection.from_float(
        lightrec.EmbeddingBagCollection(_bag_tables()), "int8", per_table=per_table, kernel_backend="torch"
    )


def test_int4_and_int8_rows_of_width_8_have_the_same_size() -> None:
    """The premise: shapes alone cannot tell the formats apart."""
    assert row_size_in_bytes(8, DataType.INT4) == row_size_in_bytes(8, DataType.INT8) == 16


@pytest.mark.parametrize("through_torch_save", [False, True])
def test_int4_state_dict_into_int8_module_raises_and_changes_nothing(through_torch_save: bool) -> None:
    saved = _quantized({"b": "int4"}).state_dict()
    if through_torch_save:
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=True)
    target = _quantized({})  # both tables int8
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(QuantRowFormatError, match=r"table 'b' was saved as INT4 rows.*stores it as INT8"):
        target.load_state_dict(saved)
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed by a refused load"


def test_matching_formats_still_load_and_give_the_same_rows() -> None:
    source = _quantized({"b": "int4"})
    target = QuantEmbeddingBagCollection(_bag_tables(), dtype="int8", per_table={"b": "int4"}, kernel_backend="torch")
    target.load_state_dict(source.state_dict())
    for t in ("a", "b"):
        assert torch.equal(target.dequantized_weight(t), source.dequantized_weight(t))


def test_state_dict_inside_a_parent_module_is_checked_under_its_prefix() -> None:
    parent_src = torch.nn.Module()
    parent_src.ebc = _quantized({"a": "int4"})
    parent_dst = torch.nn.Module()
    parent_dst.ebc = _quantized({})
    with pytest.raises(QuantRowFormatError, match=r"state_dict\['ebc.embedding_bags.a.weight'\]"):
        parent_dst.load_state_dict(parent_src.state_dict())


def test_sequence_collection_refuses_another_format() -> None:
    tables = [EmbeddingConfig(name="s", num_embeddings=4, embedding_dim=8, feature_names=["f"])]
    torch.manual_seed(0)
    source = QuantEmbeddingCollection.from_float(lightrec.EmbeddingCollection(tables), "int4", kernel_backend="torch")
    target = QuantEmbeddingCollection(tables, dtype="int8", kernel_backend="torch")
    with pytest.raises(QuantRowFormatError, match=r"table 's' was saved as INT4"):
        target.load_state_dict(source.state_dict())


def test_float_weights_of_the_stored_shape_are_refused() -> None:
    """A float [rows, 16] table has the shape of int4 rows of width 16: copying it would cast floats to bytes."""
    tables = [EmbeddingBagConfig(name="a", num_embeddings=3, embedding_dim=16, feature_names=["x"])]
    target = QuantEmbeddingBagCollection(tables, dtype="int4", kernel_backend="torch")
    assert tuple(target.embedding_bags["a"].weight.shape) == (3, 16)
    with pytest.raises(QuantRowFormatError, match=r"'embedding_bags.a.weight'.*torch.float32.*from_float"):
        target.load_state_dict({"embedding_bags.a.weight": torch.randn(3, 16)})
    assert not target.embedding_bags["a"].weight.any()


# ---- the row codec ----------------------------------------------------------------------------


@pytest.mark.parametrize("data_type", [DataType.INT8, DataType.INT4, DataType.FP16])
def test_zero_and_constant_rows_decode_exactly(data_type: DataType) -> None:
    rows = torch.tensor([[0.0] * 4, [0.5] * 4, [-3.0] * 4, [1024.0] * 4])
    decoded = dequantize_rows(quantize_rows(rows, data_type), data_type, 4)
    assert torch.equal(decoded, rows)


@pytest.mark.parametrize("data_type", [DataType.INT8, DataType.INT4, DataType.FP16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 7.0e4])
def test_non_finite_or_out_of_range_rows_raise_naming_the_table(data_type: DataType, bad: float) -> None:
    rows = torch.zeros(3, 4)
    rows[1, 2] = bad
    with pytest.raises(ValueError, match=r"table 'emb'"):
        quantize_rows(rows, data_type, table="emb")
