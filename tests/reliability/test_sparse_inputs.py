"""Sparse input that would be silently wrong: in ``KeyedJaggedTensor.validate()`` and in every collection.

Before: ``validate=True`` accepted float ids; surplus values beyond the sum of lengths were
reported without naming where; float/uint8 ids and float lengths reached the kernels and raised
raw torch errors there, and the collections pooled the first values of a KJT with surplus values
and dropped the rest. Now ``validate()`` refuses them, and the collections' always-on input check
(``lightrec.modules.feature_checks.check_collection_input``) refuses them too, also in torchrec's
lenient mode.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.sparse import KeyedJaggedTensor, SparseValueError


@pytest.mark.parametrize(
    ("values", "lengths", "match"),
    [
        (
            torch.tensor([1.0, 2.0, 3.0]),
            torch.tensor([1, 2]),
            r"values \(the ids\) of features \['f'\] must be int64 or int32, got torch.float32",
        ),
        (
            torch.tensor([1, 2, 3], dtype=torch.uint8),
            torch.tensor([1, 2]),
            r"values \(the ids\).*got torch.uint8",
        ),
        (
            torch.tensor([1, 2, 3]),
            torch.tensor([1.0, 2.0]),
            r"lengths of features \['f'\] must be int64 or int32, got torch.float32",
        ),
        (torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 2]), r"2 values beyond the last feature 'f'"),
    ],
)
def test_validate_refuses_silently_wrong_ids(values: torch.Tensor, lengths: torch.Tensor, match: str) -> None:
    with pytest.raises(SparseValueError, match=match):
        KeyedJaggedTensor(keys=["f"], values=values, lengths=lengths, validate=True)
    with pytest.raises(SparseValueError, match=match):
        KeyedJaggedTensor(keys=["f"], values=values, lengths=lengths).validate()


def test_negative_length_names_the_feature() -> None:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(2), lengths=torch.tensor([1, 1, 1, -1]))
    with pytest.raises(SparseValueError, match=r"feature 'b' has a negative length"):
        kjt.validate()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_ids_pass(dtype: torch.dtype) -> None:
    KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(4, dtype=dtype), lengths=torch.tensor([1, 1, 2, 0], dtype=dtype),
        validate=True,
    )  # fmt: skip


# ------------------------------------------------------------------ the collections, always on
# Before: an EBC fed surplus values pooled the first ones and dropped the rest silently; float ids
# failed deep in a kernel (or were cast). Now every collection refuses both at its input check
# (``lightrec.modules.feature_checks.check_collection_input``), also in torchrec's lenient mode.


def _tables() -> list:
    from lightrec.modules import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
        EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=10, feature_names=["b"]),
    ]


def _collections() -> dict:
    from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
    from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection, EmbeddingConfig
    from lightrec.quant import QuantEmbeddingBagCollection

    torch.manual_seed(0)
    ec_tables = [EmbeddingConfig(name=t.name, embedding_dim=4, num_embeddings=10, feature_names=t.feature_names)
                 for t in _tables()]  # fmt: skip
    ebc = EmbeddingBagCollection(_tables())
    return {
        "EmbeddingBagCollection": ebc,
        "EmbeddingCollection": EmbeddingCollection(ec_tables),
        "FusedEmbeddingBagCollection": FusedEmbeddingBagCollection(
            _tables(), optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}
        ),
        "FusedEmbeddingCollection": FusedEmbeddingCollection(
            ec_tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}
        ),
        "QuantEmbeddingBagCollection": QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.qint8),
    }


def _kjt(
    values: torch.Tensor, lengths: torch.Tensor, keys: tuple[str, ...] = ("a", "b")
) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths)


GOOD_LENGTHS = torch.tensor([1, 2, 0, 1])  # a: [1, 2], b: [0, 1] -> 4 ids
BAD_INPUTS = {
    "surplus values": (
        _kjt(torch.tensor([1, 2, 3, 4, 5, 6]), GOOD_LENGTHS),
        r"6 values but its lengths count 4 \(\+2 beyond the last feature 'b'\)",
    ),
    "surplus values behind an unread key": (
        _kjt(torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.tensor([1, 2, 0, 1, 1, 0]), ("a", "b", "zz")),
        r"7 values but its lengths count 5 \(\+2 beyond the last feature 'zz'\)",
    ),
    "float ids": (_kjt(torch.tensor([1.0, 2.0, 3.0, 4.0]), GOOD_LENGTHS), r"got torch.float32"),
    "uint8 ids": (_kjt(torch.tensor([1, 2, 3, 4], dtype=torch.uint8), GOOD_LENGTHS), r"got torch.uint8"),
    "float lengths": (
        _kjt(torch.tensor([1, 2, 3, 4]), GOOD_LENGTHS.float()),
        r"lengths of features .* got torch.float32",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("strict", [False, True], ids=["torchrec-lenient", "strict"])
def test_collections_refuse_silently_wrong_batches(case: str, strict: bool) -> None:
    from lightrec.modules.feature_checks import strict_checks

    kjt, match = BAD_INPUTS[case]
    for name, collection in _collections().items():
        if strict and "zz" in kjt.keys():
            continue  # strict mode refuses the unread key first (tested in tests/modules)
        with strict_checks(strict), pytest.raises(SparseValueError, match=match):
            collection(kjt)
        assert name  # every collection kind was called


def test_collections_accept_a_good_batch_and_an_unread_key() -> None:
    """The same collections take well-formed input (and torchrec's extra key) unchanged."""
    good = _kjt(torch.tensor([1, 2, 3, 4]), GOOD_LENGTHS)
    extra = _kjt(torch.tensor([1, 2, 3, 4, 9]), torch.tensor([1, 2, 0, 1, 1, 0]), ("a", "b", "zz"))
    for collection in _collections().values():
        collection(good)
        collection(extra)


def _sharded_refuses(rank: int, world_size: int) -> list[str]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(_tables(), device=torch.device("meta"))
    plan = construct_module_sharding_plan(
        ebc, {"t0": table_wise(rank=0), "t1": row_wise()}, world_size=world_size
    )
    sharded = EmbeddingBagCollectionSharder().shard(
        ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD), torch.device("cpu")
    )
    messages = []
    for kjt, _ in (BAD_INPUTS["surplus values"], BAD_INPUTS["float ids"]):
        try:
            sharded(kjt).wait()
        except SparseValueError as e:
            messages.append(str(e))
    sharded(_kjt(torch.tensor([1, 2, 3, 4]), GOOD_LENGTHS)).wait()  # the ranks are still in step
    return messages


def test_sharded_collection_refuses_on_every_rank() -> None:
    """2 real gloo ranks: both refuse before the input dist, so no rank is left waiting in a collective."""
    from tests.multiprocess import run_ranks

    results = run_ranks(_sharded_refuses, world_size=2)
    for messages in results:
        assert len(messages) == 2
        assert "beyond the last feature 'b'" in messages[0]
        assert "got torch.float32" in messages[1]
