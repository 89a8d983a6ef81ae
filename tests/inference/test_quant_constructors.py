"""The quantized collections' constructors: the parameters users call them with stay as they are.

Both collections hand their arguments to ``QuantCollectionBase``; a change there (folding the twin
parameter lists, say) must not move, rename or re-default a parameter of the class users construct.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from lightrec.inference import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from lightrec.modules import DataType
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

REQUIRED = inspect.Parameter.empty
P = inspect.Parameter.POSITIONAL_OR_KEYWORD
K = inspect.Parameter.KEYWORD_ONLY

# (name, kind, default) in signature order; is_weighted is the pooled collection's second positional
_AFTER_IS_WEIGHTED: list[tuple[str, object, object]] = [
    ("device", P, None),
    ("dtype", P, DataType.INT8),
    ("per_table", P, None),
    ("row_alignment", P, 16),
    ("bounds_check", P, "error"),
    ("kernel_backend", P, "auto"),
    ("use_fbgemm", K, None),
    ("backend", K, None),
]
SIGNATURES: dict[type, list[tuple[str, object, object]]] = {
    QuantEmbeddingBagCollection: [("tables", P, REQUIRED), ("is_weighted", P, False), *_AFTER_IS_WEIGHTED],
    QuantEmbeddingCollection: [("tables", P, REQUIRED), *_AFTER_IS_WEIGHTED],
}


@pytest.mark.parametrize("cls", list(SIGNATURES), ids=lambda c: c.__name__)
def test_constructor_signature_is_unchanged(cls: type) -> None:
    params = inspect.signature(cls).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == SIGNATURES[cls]


@pytest.mark.parametrize("cls", list(SIGNATURES), ids=lambda c: c.__name__)
def test_docstring_documents_every_argument(cls: type) -> None:
    doc = inspect.getdoc(cls) or ""
    assert "Args:" in doc
    assert all(name in doc for name, _, _ in SIGNATURES[cls])


def test_positional_calls_reach_the_right_parameters() -> None:
    bag = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])]
    ebc = QuantEmbeddingBagCollection(bag, True, "cpu", "int4", {"t": "fp16"}, 8, "clamp", "torch")
    assert ebc.is_weighted() and ebc.kernel == "torch" and ebc._bounds_check == "clamp"
    assert ebc._row_alignment == 8 and ebc.embedding_bag_configs()[0].data_type == DataType.FP16
    assert ebc.device == torch.device("cpu")
    seq = [EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])]
    ec = QuantEmbeddingCollection(seq, "cpu", "int4", None, 8, "skip", "torch")
    assert ec.kernel == "torch" and ec._bounds_check == "skip" and ec._row_alignment == 8
    assert ec.embedding_configs()[0].data_type == DataType.INT4


@pytest.mark.parametrize(
    "cls,tables,wanted",
    [
        (QuantEmbeddingBagCollection, [EmbeddingConfig(name="t", num_embeddings=4, embedding_dim=8)], "EmbeddingBagConfig"),
        (QuantEmbeddingCollection, [EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=8)], "EmbeddingConfig"),
    ],
    ids=["bag", "sequence"],
)
def test_each_collection_takes_only_its_config_type(cls: type, tables: list, wanted: str) -> None:
    with pytest.raises(TypeError, match=f"{cls.__name__} takes {wanted} tables"):
        cls(tables)
