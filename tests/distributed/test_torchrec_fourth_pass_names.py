"""torchrec's names of issue 37 still missing after the third pass, at torchrec's paths, each used
the way torchrec's callers use it on a small case against a hand-computed or plain-PyTorch reference."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from tests.multiprocess import run_ranks

NAMES = {
    "lightrec.distributed.embedding_lookup": ["GroupedPooledEmbeddingsLookup", "GroupedEmbeddingsLookup"],
    "lightrec.distributed.embedding_types": ["ShardedEmbeddingTable", "GroupedEmbeddingConfig", "KJTList"],
    "lightrec.distributed.model_parallel": ["DataParallelWrapper", "DefaultDataParallelWrapper", "get_module",
                                            "get_unwrapped_module"],
    "lightrec.distributed.quant_embedding_kernel": ["_unwrap_kjt", "_unwrap_kjt_for_cpu"],
    "lightrec.distributed.embeddingbag": ["_create_mean_pooling_divisor", "_apply_mean_pooling"],
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


# ------------------------------------------------------------------------ embedding_types
def test_grouped_embedding_config_over_sharded_tables() -> None:
    from lightrec.distributed.embedding_types import (
        EmbeddingComputeKernel,
        GroupedEmbeddingConfig,
        ShardedEmbeddingTable,
    )
    from lightrec.distributed.sharding.common import ShardedTable
    from lightrec.distributed.types import ParameterSharding
    from lightrec.modules.embedding_configs import DataType, PoolingType

    assert ShardedEmbeddingTable is ShardedTable
    tables = [
        ShardedEmbeddingTable(
            config=EmbeddingBagConfig(name=name, num_embeddings=4, embedding_dim=dim, feature_names=features),
            sharding=ParameterSharding("table_wise", "fused", ranks=[0]),
            shards=[], optimizer=None, source=None, pooling=PoolingType.SUM,
        )
        for name, dim, features in (("a", 2, ["x", "y"]), ("b", 3, ["z"]))
    ]  # fmt: skip
    group = GroupedEmbeddingConfig(DataType.FP32, PoolingType.SUM, False, False, EmbeddingComputeKernel.FUSED, tables)
    assert group.feature_names() == group.embedding_names() == ["x", "y", "z"] and group.num_features() == 3
    assert group.table_names() == ["a", "b"] and group.embedding_dims() == [2, 2, 3] and group.dim_sum() == 7


def test_kjt_list_indexes_iterates_and_records_streams() -> None:
    from lightrec.distributed.embedding_types import KJTList

    recorded: list[object] = []

    class Recording(KeyedJaggedTensor):
        def record_stream(self, stream: torch.Stream) -> None:
            recorded.append((self.keys()[0], stream))

    kjts = [Recording(keys=[k], values=torch.tensor([1]), lengths=torch.tensor([1])) for k in ("f", "g")]
    lst = KJTList(kjts)
    assert len(lst) == 2 and lst[1] is kjts[1] and list(lst) == kjts
    stream = object()
    lst.record_stream(stream)  # type: ignore[arg-type]
    assert recorded == [("f", stream), ("g", stream)]


# ---------------------------------------------------------------- quant_embedding_kernel
def test_unwrap_kjt_gives_kernel_triples() -> None:
    from lightrec.distributed.quant_embedding_kernel import _unwrap_kjt, _unwrap_kjt_for_cpu

    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([3, 1, 4]), lengths=torch.tensor([2, 0, 1, 0]),
                            weights=torch.tensor([0.5, 1.0, 2.0]))  # fmt: skip
    indices, offsets, weights = _unwrap_kjt(kjt)
    assert indices.dtype == offsets.dtype == torch.int32
    assert indices.tolist() == [3, 1, 4] and offsets.tolist() == [0, 2, 2, 3, 3] and weights is not None
    indices, offsets, weights = _unwrap_kjt_for_cpu(kjt)
    assert indices.dtype == offsets.dtype == torch.int64 and weights is not None and weights.tolist() == [0.5, 1, 2]
    assert _unwrap_kjt_for_cpu(kjt, weighted=False)[2] is None
    unweighted = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1], dtype=torch.int32), lengths=torch.tensor([1]))
    assert _unwrap_kjt_for_cpu(unweighted)[1].dtype == torch.int32 and _unwrap_kjt_for_cpu(unweighted)[2] is None
    with pytest.raises(ValueError, match="weighted=True"):
        _unwrap_kjt_for_cpu(unweighted, weighted=True)


# ------------------------------------------------------------------ mean pooling divisor
def _divisor(kjt: KeyedJaggedTensor, rs: dict[str, list[str]], dims: list[int], **kw: object) -> torch.Tensor:
    from lightrec.distributed.embeddingbag import _create_mean_pooling_divisor

    keys = kjt.keys()
    return _create_mean_pooling_divisor(
        lengths=kjt.lengths(), keys=keys, offsets=kjt.offsets(), stride=kjt.stride(),
        stride_per_key=[kjt.stride()] * len(keys), dim_per_key=torch.tensor(dims), pooling_type_to_rs_features=rs,
        embedding_names=keys, embedding_dims=dims, variable_batch_per_feature=False,
        kjt_inverse_order=torch.arange(len(keys)), kjt_key_indices={k: i for i, k in enumerate(keys)},
        kt_key_ordering=torch.arange(len(keys)), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_mean_pooling_divisor_turns_sum_pooling_into_mean_pooling() -> None:
    from lightrec.distributed.embeddingbag import _apply_mean_pooling

    torch.manual_seed(0)
    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2, 3, 0, 1, 2]), lengths=torch.tensor([2, 0, 1, 3]))
    lengths_before = kjt.lengths().clone()
    divisor = _divisor(kjt, {"MEAN": ["f", "g"], "SUM": []}, [2, 3])
    want = torch.tensor([[2, 2, 1, 1, 1], [0, 0, 3, 3, 3]], dtype=torch.float) + 1e-6
    torch.testing.assert_close(divisor, want)
    assert torch.equal(kjt.lengths(), lengths_before)  # not modified (torchrec's is, in place)
    tables = [EmbeddingBagConfig(name="t" + f, num_embeddings=4, embedding_dim=d, feature_names=[f])
              for f, d in (("f", 2), ("g", 3))]  # fmt: skip
    ebc = EmbeddingBagCollection(tables)
    for bag in ebc.embedding_bags.values():
        nn.init.normal_(bag.weight)
    summed = ebc(kjt)
    mean = _apply_mean_pooling(summed, divisor)
    for f in ("f", "g"):
        ref = nn.functional.embedding_bag(kjt[f].values(), ebc.embedding_bags["t" + f].weight,
                                          kjt[f].offsets()[:-1], mode="mean")  # fmt: skip
        torch.testing.assert_close(mean[f], ref)  # an empty bag stays 0
    assert mean.keys() == summed.keys()
    sum_g = _divisor(kjt, {"MEAN": ["f"], "SUM": ["g"]}, [2, 3])
    torch.testing.assert_close(sum_g[:, 2:], torch.full((2, 3), 1 + 1e-6))
    weighted = _divisor(kjt, {"MEAN": ["f", "g"]}, [2, 3], weights=torch.tensor([0.5, 0.25, 2.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(weighted[:, [0, 2]], torch.tensor([[0.75, 2.0], [0.0, 3.0]]) + 1e-6)


# ------------------------------------------------------------------------ model_parallel
def _wrapper_body(rank: int, world_size: int) -> tuple[bool, bool, bool, bool, list[int]]:
    from lightrec.distributed.model_parallel import (
        DataParallelWrapper,
        DefaultDataParallelWrapper,
        DistributedModelParallel,
        get_module,
        get_unwrapped_module,
    )
    from lightrec.distributed.types import ShardingEnv

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(
                [EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4, feature_names=["f"])], device="meta"
            )
            self.dense = nn.Linear(4, 1)
            self.unused = nn.Linear(1, 1)

        def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
            return self.dense(self.ebc(kjt).values())

    dmp = DistributedModelParallel(Model(), data_parallel_wrapper=DefaultDataParallelWrapper(
        find_unused_parameters=True, allreduce_comm_precision="fp16"))  # fmt: skip
    ddp = dmp.data_parallel
    assert isinstance(ddp, DistributedDataParallel)
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([rank, 3]), lengths=torch.tensor([1, 1]))
    dmp(kjt).sum().backward()  # `unused` gets no gradient: fine with find_unused_parameters=True
    calls: list[int] = []

    class Custom(DataParallelWrapper):
        def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
            calls.append(env.world_size)

    plain = DistributedModelParallel(Model(), data_parallel_wrapper=Custom())
    return (
        ddp.find_unused_parameters,
        get_module(dmp) is ddp,
        get_unwrapped_module(dmp) is dmp.module and isinstance(dmp.module, Model),
        get_module(plain) is plain.module and plain.data_parallel is None and get_module(ddp) is ddp,
        calls,
    )


def test_data_parallel_wrapper_and_unwrapping_on_two_ranks() -> None:
    assert run_ranks(_wrapper_body, 2) == [(True, True, True, True, [2])] * 2
    from lightrec.distributed.model_parallel import DefaultDataParallelWrapper

    with pytest.raises(ValueError, match="allreduce_comm_precision"):
        DefaultDataParallelWrapper(allreduce_comm_precision="int8")


# ------------------------------------------------------------------ Criteo reader arguments
def _write_days(tmp_path: Path, rows_per_day: list[int]) -> tuple[list[list[str]], np.ndarray]:
    """Binary Criteo days whose dense column 0 numbers the rows 0.. across the days."""
    files, first = [], 0
    for day, rows in enumerate(rows_per_day):
        index = np.arange(first, first + rows)
        arrays = {"dense": np.repeat(index[:, None], 13, 1).astype(np.float32),
                  "sparse": np.repeat(index[:, None], 26, 1).astype(np.int64),
                  "labels": (index[:, None] % 2).astype(np.int32)}  # fmt: skip
        names = []
        for kind, array in arrays.items():
            np.save(tmp_path / f"day_{day}_{kind}.npy", array)
            names.append(str(tmp_path / f"day_{day}_{kind}.npy"))
        files.append(names)
        first += rows
    return [[f[k] for f in files] for k in range(3)], np.arange(first)


def test_criteo_reader_drop_last_and_shuffled_training_set(tmp_path: Path) -> None:
    from lightrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    (dense, sparse, labels), rows = _write_days(tmp_path, [5, 4])
    kept = InMemoryBinaryCriteoIterDataPipe("train", dense, sparse, labels, 4, 0, 1)
    dropped = InMemoryBinaryCriteoIterDataPipe("train", dense, sparse, labels, 4, 0, 1, drop_last=True)
    assert [b.batch_size for b in kept] == [4, 4, 1] and len(kept) == 3
    assert [b.batch_size for b in dropped] == [4, 4] and len(dropped) == 2

    def share(rank: int, seed: int, stage: str = "train") -> list[int]:
        pipe = InMemoryBinaryCriteoIterDataPipe(stage, dense, sparse, labels, 2, rank, 2, shuffle_training_set=True,
                                                shuffle_training_set_random_seed=seed)  # fmt: skip
        got = [int(x) for b in pipe for x in b.dense_features[:, 0]]
        assert all(torch.equal(b.sparse_features["cat_3"].values(), b.dense_features[:, 0].long()) for b in pipe)
        return got

    # torchrec's layout: row j of the concatenated days goes to position perm[j]; rank r reads block r
    perm = np.random.RandomState(7).permutation(9)
    shuffled = np.empty(9, dtype=np.int64)
    shuffled[perm] = rows
    assert share(0, 7) == shuffled[:5].tolist() and share(1, 7) == shuffled[5:].tolist()  # 5 + 4 rows
    assert sorted(share(0, 3) + share(1, 3)) == rows.tolist() and share(0, 3) != share(0, 7)
    assert share(0, 7, stage="val") == [0, 1]  # only the training set is shuffled (val: first half of day 0)
