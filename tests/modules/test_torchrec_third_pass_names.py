"""Issue 37's module-level names at torchrec's paths: the collection interfaces (and who implements
them), ``get_embedding_names_by_table``, ``DATA_TYPE_NUM_BITS``, ``quant_prep_enable_cache_features_order``,
``TOTAL_TRAINING_SAMPLES`` and ``torchrec.optim``'s re-exports."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from lightrec.modules.embedding_configs import DATA_TYPE_NUM_BITS, DataType
from lightrec.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
    get_embedding_names_by_table,
)


def _bag_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=4, feature_names=["f", "g"]),
        EmbeddingBagConfig(name="t2", num_embeddings=10, embedding_dim=4, feature_names=["g"]),
    ]


def test_get_embedding_names_by_table_qualifies_shared_features() -> None:
    assert get_embedding_names_by_table(_bag_tables()) == [["f", "g@t1"], ["g@t2"]]
    assert get_embedding_names_by_table([EmbeddingConfig(name="t", num_embeddings=2, embedding_dim=2,
                                                         feature_names=["a", "b"])]) == [["a", "b"]]  # fmt: skip


def test_every_collection_implements_torchrecs_interface() -> None:
    from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
    from lightrec.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection

    ebc = EmbeddingBagCollection(_bag_tables())
    assert isinstance(ebc, EmbeddingBagCollectionInterface)
    assert isinstance(QuantEmbeddingBagCollection.from_float(ebc, dtype="int8"), EmbeddingBagCollectionInterface)
    assert issubclass(FusedEmbeddingBagCollection, EmbeddingBagCollectionInterface)
    ec = EmbeddingCollection(
        [EmbeddingConfig(name="t1", num_embeddings=5, embedding_dim=4, feature_names=["f", "g"]),
         EmbeddingConfig(name="t2", num_embeddings=5, embedding_dim=4, feature_names=["g"])], need_indices=True,
    )  # fmt: skip
    assert isinstance(ec, EmbeddingCollectionInterface)
    assert ec.need_indices() and ec.embedding_dim() == 4 and ec.embedding_names_by_table() == [["f", "g@t1"], ["g@t2"]]
    assert issubclass(QuantEmbeddingCollection, EmbeddingCollectionInterface)
    assert issubclass(FusedEmbeddingCollection, EmbeddingCollectionInterface)
    mixed = EmbeddingCollection([EmbeddingConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=["x"]),
                                 EmbeddingConfig(name="b", num_embeddings=2, embedding_dim=3, feature_names=["y"])])
    with pytest.raises(ValueError, match=r"embedding dims \[2, 3\]"):
        mixed.embedding_dim()
    torch.jit.script(ec)  # the abstract base keeps the collections scriptable


def test_a_user_collection_subclasses_the_interface() -> None:
    class Constant(EmbeddingBagCollectionInterface):
        def __init__(self) -> None:
            super().__init__()
            self.table = EmbeddingBagConfig(name="t", num_embeddings=1, embedding_dim=2, feature_names=["f"])

        def forward(self, features: KeyedJaggedTensor):  # type: ignore[no-untyped-def]
            from lightrec import KeyedTensor

            return KeyedTensor(["f"], [2], torch.ones(features.stride(), 2))

        def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
            return [self.table]

        def is_weighted(self) -> bool:
            return False

    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([0]), lengths=torch.tensor([1]))
    assert Constant()(kjt).values().shape == (1, 2)

    class Incomplete(EmbeddingBagCollectionInterface):
        def forward(self, features: KeyedJaggedTensor):  # type: ignore[no-untyped-def]
            return features

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


def test_data_type_num_bits() -> None:
    assert DATA_TYPE_NUM_BITS == {DataType.FP32: 32, DataType.FP16: 16, DataType.BF16: 16, DataType.INT8: 8,
                                  DataType.INT4: 4, DataType.INT2: 2}  # fmt: skip
    assert set(DATA_TYPE_NUM_BITS) == set(DataType)


def test_quant_prep_enable_cache_features_order_caches_the_key_permutation() -> None:
    from lightrec.inference import quantize
    from lightrec.quant.embedding_modules import quant_prep_enable_cache_features_order

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(_bag_tables()[:1])
            self.ec = EmbeddingCollection([EmbeddingConfig(name="s", num_embeddings=10, embedding_dim=4,
                                                           feature_names=["h"])])  # fmt: skip

    model = Model()
    quant_prep_enable_cache_features_order(model, [EmbeddingBagCollection])  # the EBC only
    q = quantize(model, dtype="int8")
    assert q.ebc.cache_features_order and not q.ec.cache_features_order
    kjt = KeyedJaggedTensor(keys=["h", "g", "f"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
                            lengths=torch.tensor([1, 1, 1, 1, 1, 1]))  # fmt: skip
    plain = quantize(Model(), dtype="int8")
    plain.ebc.load_state_dict(q.ebc.state_dict())
    first = q.ebc(kjt).values()
    cached = q.ebc._cached_order_tensor
    assert q.ebc._cached_order == [2, 1] and cached is not None
    torch.testing.assert_close(q.ebc(kjt).values(), first)
    assert q.ebc._cached_order_tensor is cached  # reused, not built again
    torch.testing.assert_close(first, plain.ebc(kjt).values())  # the same numbers as without the cache
    other = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([7, 8, 9, 1]), lengths=torch.tensor([1, 1, 1, 1]))
    torch.testing.assert_close(q.ebc(other).values(), plain.ebc(other).values())  # already in order: no permute
    swapped = KeyedJaggedTensor(keys=["g", "f"], values=torch.tensor([7, 8, 9, 1]), lengths=torch.tensor([1, 1, 1, 1]))
    torch.testing.assert_close(q.ebc(swapped).values(), plain.ebc(swapped).values())  # new keys: a new permutation
    assert q.ebc._cached_order == [1, 0]


def test_criteo_total_training_samples_and_optim_reexports() -> None:
    import lightrec.optim as optim
    from lightrec.datasets.criteo import TOTAL_TRAINING_SAMPLES

    assert TOTAL_TRAINING_SAMPLES == 4_195_197_692
    assert optim.SGD is torch.optim.SGD and optim.Adam is torch.optim.Adam and optim.Adagrad is torch.optim.Adagrad
    from lightrec.optim.clipping import GradientClippingOptimizer
    from lightrec.optim.rowwise_optimizers import LAMB
    from lightrec.optim.warmup import WarmupOptimizer

    assert optim.GradientClippingOptimizer is GradientClippingOptimizer and optim.WarmupOptimizer is WarmupOptimizer
    assert optim.optimizers.LAMB is LAMB  # a submodule attribute, as in torchrec
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        optim.nope  # noqa: B018
