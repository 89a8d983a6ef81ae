"""Malformed sparse and dense input: a typed error naming the feature, the value and the fix (issue 23).

Before, each case failed deep inside torch with a message that named no feature -- "Expected
i < index_size" / "the last offset value should be the size of the indices tensor" (a negative
length whose neighbours keep the sum right), "per_sample_weights ... must have the same shape"
(weights shorter than the ids), "offsets[-1] can not be greater than input's length" (a ``stride``
that disagrees with the lengths), "shape '[2, -1]' is invalid" (lengths not divisible by the keys),
"if input is 2D, then offsets has to be None" (2-D values), "split_with_sizes expects ..." (a
``KeyedTensor`` whose ``length_per_key`` does not add up), "mat1 and mat2 must have the same
dtype" (int64 dense features into DLRM) -- or was accepted: NaN per-id weights gave NaN outputs.

Now the collections' always-on input check (``check_collection_input``) refuses the sparse cases
in every collection, unsharded and sharded (before the input dist, on the rank that got the
batch), the KeyedTensor refuses itself when built, and the dense arches refuse a non-float input.
"""

from __future__ import annotations

import re

import pytest
import torch

from lightrec.modules import DenseShapeError
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor, SparseValueError

KEYS = ["a", "b"]
IDS = torch.tensor([1, 2, 3, 4])
LENGTHS = torch.tensor([1, 2, 0, 1])  # a: [1, 2], b: [0, 1]


def _kjt(**kwargs: object) -> KeyedJaggedTensor:
    parts: dict = {"keys": KEYS, "values": IDS, "lengths": LENGTHS, **kwargs}
    return KeyedJaggedTensor(**parts)


#: (KJT, message) for every collection, weighted or not.
MALFORMED = {
    "negative length, sum still right": (
        _kjt(lengths=torch.tensor([3, -1, 1, 1])),
        r"feature 'a' has a negative length: -1 ids for sample 1 \(lengths\[1\]\).*must be non-negative",
    ),
    "weights shorter than the ids": (
        _kjt(weights=torch.ones(3)),
        r"weights of features \['a', 'b'\] has 3 entries \(shape \[3\]\) but values has 4: give one weight per id",
    ),
    "stride disagrees with the lengths": (
        _kjt(stride=3),
        r"stride=3 \(the batch size\) with 2 keys \['a', 'b'\] needs 6 lengths, got 4 \(a batch of 2\)",
    ),
    "lengths not divisible by the keys": (
        _kjt(values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1])),
        r"3 lengths, not divisible by its 2 keys \['a', 'b'\]; lengths must hold batch_size entries per key",
    ),
    "2-D values": (
        _kjt(values=IDS.reshape(4, 1)),
        r"values of features \['a', 'b'\] must be 1-D .* got shape \[4, 1\]; flatten them",
    ),
}

#: Only for collections that read the weights.
NAN_WEIGHT = (
    _kjt(weights=torch.tensor([1.0, 1.0, 1.0, float("nan")])),
    r"feature 'b' has a non-finite weight nan for sample 1 \(weights\[3\]\); per-id weights must be finite",
)


def _tables(weighted: bool = False) -> list:
    from lightrec.modules import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
        EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=10, feature_names=["b"]),
    ]


def _collections(weighted: bool) -> dict:
    from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
    from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection, EmbeddingConfig
    from lightrec.quant import QuantEmbeddingBagCollection

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_tables(), is_weighted=weighted)
    out = {
        "EmbeddingBagCollection": ebc,
        "FusedEmbeddingBagCollection": FusedEmbeddingBagCollection(
            _tables(), is_weighted=weighted, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}
        ),
        "QuantEmbeddingBagCollection": QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.qint8),
    }
    if not weighted:  # the sequence collections read no weights
        ec_tables = [EmbeddingConfig(name=t.name, embedding_dim=4, num_embeddings=10, feature_names=t.feature_names)
                     for t in _tables()]  # fmt: skip
        out["EmbeddingCollection"] = EmbeddingCollection(ec_tables)
        out["FusedEmbeddingCollection"] = FusedEmbeddingCollection(
            ec_tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}
        )
    return out


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_unsharded_collection_names_the_malformed_input(case: str, weighted: bool) -> None:
    kjt, match = MALFORMED[case]
    if weighted and kjt.weights_or_none() is None:
        kjt = KeyedJaggedTensor(
            keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=torch.ones(kjt.values().shape[0]),
            stride=kjt.stride() if case == "stride disagrees with the lengths" else None,
        )  # fmt: skip
    for name, collection in _collections(weighted).items():
        with pytest.raises(SparseValueError, match=match):
            collection(kjt)
        assert name


def test_weighted_collections_refuse_a_nan_weight_and_unweighted_ones_ignore_it() -> None:
    kjt, match = NAN_WEIGHT
    for collection in _collections(weighted=True).values():
        with pytest.raises(SparseValueError, match=match):
            collection(kjt)
    for collection in _collections(weighted=False).values():
        collection(kjt)  # the weights are not read: nothing to refuse
    good = _kjt(weights=torch.ones(4))
    for collection in _collections(weighted=True).values():
        collection(good)


def test_batched_kernel_check_names_a_nan_weight_and_a_negative_length() -> None:
    """The lookup kernels' own input check (one host read per call, the one that catches these on an
    accelerator, where the collections do not read the lengths) names them as well."""
    from lightrec.kernels import BatchedEmbeddingBag

    module = BatchedEmbeddingBag([(10, 4), (10, 4)])  # tables t0 and t1
    offsets = torch.tensor([0, 1, 2, 3, 4])  # 2 features x batch 2
    with pytest.raises(SparseValueError, match=r"feature 1 \(table 't1'\) has a non-finite weight nan for sample 0"):
        module(IDS, offsets, per_sample_weights=torch.tensor([1.0, 1.0, float("nan"), 1.0]))
    with pytest.raises(SparseValueError, match=r"feature 0 \(table 't0'\) has a negative length: -1 ids for sample 1"):
        module(IDS, torch.tensor([0, 2, 1, 3, 4]))


def test_keyed_tensor_refuses_lengths_that_do_not_add_up() -> None:
    with pytest.raises(SparseValueError, match=r"length_per_key \[2, 3\] of keys \['a', 'b'\] sums to 5 but values has "
                                               r"shape \[2, 4\] \(key_dim=1\)"):  # fmt: skip
        KeyedTensor(keys=["a", "b"], length_per_key=[2, 3], values=torch.zeros(2, 4))
    assert KeyedTensor(keys=["a", "b"], length_per_key=[1, 3], values=torch.zeros(2, 4))["b"].shape == (2, 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_dlrm_refuses_integer_dense_features(dtype: torch.dtype) -> None:
    from lightrec.models import DLRM
    from lightrec.modules import EmbeddingBagCollection

    model = DLRM(EmbeddingBagCollection(_tables()), dense_in_features=3, dense_arch_layer_sizes=[4],
                 over_arch_layer_sizes=[4, 1])  # fmt: skip
    with pytest.raises(DenseShapeError, match=rf"dense_features must be a floating-point tensor .* got dtype {dtype}"):
        model(torch.ones(2, 3, dtype=dtype), _kjt())
    assert model(torch.ones(2, 3), _kjt()).shape == (2, 1)


# ------------------------------------------------------------------ 2 real ranks, sharded
def _sharded_refuses(rank: int, world_size: int) -> dict[str, str]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules import EmbeddingBagCollection

    env = ShardingEnv.from_process_group(dist.group.WORLD)
    out: dict[str, str] = {}
    for weighted in (False, True):
        ebc = EmbeddingBagCollection(_tables(), is_weighted=weighted, device=torch.device("meta"))
        plan = construct_module_sharding_plan(ebc, {"t0": table_wise(rank=0), "t1": row_wise()}, world_size=world_size)
        sharded = EmbeddingBagCollectionSharder().shard(ebc, plan, env, torch.device("cpu"))
        cases = dict(MALFORMED)
        if weighted:
            cases = {"nan weight": NAN_WEIGHT, "weights shorter than the ids": MALFORMED["weights shorter than the ids"]}
        for case, (kjt, _) in cases.items():
            for ahead in (False, True):  # forward, or the input dist started ahead (SparseDistPipeline)
                try:
                    sharded.input_dist(kjt) if ahead else sharded(kjt).wait()
                    out[f"{case} {weighted} {ahead}"] = "accepted"
                except SparseValueError as e:
                    out[f"{case} {weighted} {ahead}"] = str(e)
        good = _kjt(weights=torch.ones(4)) if weighted else _kjt()
        out[f"good {weighted}"] = str(sharded(good).wait().values().shape)  # the ranks are still in step
    return out


def test_two_rank_sharded_collection_refuses_before_the_input_dist() -> None:
    """Both ranks get the bad batch and both refuse it before any collective (also when the input
    dist is started ahead of the forward), so no rank waits in an all-to-all; a good batch then runs."""
    from tests.multiprocess import run_ranks

    results = run_ranks(_sharded_refuses, world_size=2)
    expected = {case: match for case, (_, match) in MALFORMED.items()}
    expected["nan weight"] = NAN_WEIGHT[1]
    for out in results:
        for key, message in out.items():
            if key.startswith("good"):
                assert message == "torch.Size([2, 8])"
                continue
            case = key.rsplit(" ", 2)[0]
            assert message != "accepted", key
            assert re.search(expected[case], message), (key, message)
        assert len(out) == 2 * (len(MALFORMED) + 2) + 2


@pytest.mark.gpu
def test_cuda_collections_find_negative_lengths_and_nan_weights_in_their_id_check() -> None:
    """On CUDA the collections do not read the lengths (a device sync): the id check they make anyway
    (one host read) finds a negative length (EBC's per-table check, the fused kernels' offsets
    check) and a NaN weight (the fused kernels' check, id_check="sync")."""
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.modules import EmbeddingBagCollection

    cuda = torch.device("cuda")
    negative, _ = MALFORMED["negative length, sum still right"]
    with pytest.raises(SparseValueError, match=r"feature 'a' has a negative length: -1 ids for sample 1"):
        EmbeddingBagCollection(_tables(), device=cuda)(negative.to(cuda))
    fused = FusedEmbeddingBagCollection(
        _tables(), optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, is_weighted=True, device=cuda,
        id_check="sync",
    )  # fmt: skip
    weighted = KeyedJaggedTensor(keys=KEYS, values=negative.values(), lengths=negative.lengths(), weights=torch.ones(4))
    with pytest.raises(SparseValueError, match=r"feature 0 \(table 't0'\) has a negative length: -1 ids for sample 1"):
        fused(weighted.to(cuda))
    with pytest.raises(SparseValueError, match=r"feature 1 \(table 't1'\) has a non-finite weight nan for sample 1"):
        fused(NAN_WEIGHT[0].to(cuda))
