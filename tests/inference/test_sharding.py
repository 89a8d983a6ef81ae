"""Inference sharding: tables split over several (CPU) devices give the unsharded model's outputs."""

from __future__ import annotations

import pytest
import torch

import lightrec
from lightrec.fx.tracer import symbolic_trace
from lightrec.inference import (
    ShardedQuantEmbeddingBagCollection,
    quantize,
    shard_for_inference,
    shard_modules,
)
from tests.inference.helpers import dlrm, kernel_params, kjt, tables


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("weighted", [False, True])
def test_sharded_collection_equals_unsharded(kernel: str, weighted: bool) -> None:
    torch.manual_seed(0)
    q = quantize(lightrec.EmbeddingBagCollection(tables(), is_weighted=weighted), "int8", per_table={"t1": "int4"})
    sharded = shard_for_inference(q, devices=["cpu", "cpu", "cpu"], kernel_backend=kernel)
    assert isinstance(sharded, ShardedQuantEmbeddingBagCollection)
    assert len(sharded.lookups) == 3  # one group per table here (3 devices; t2 also pools by MEAN)
    batch = kjt(batch=7, weighted=weighted).permute([3, 1, 0, 2])  # any key order
    got, want = sharded(batch), q(batch)
    assert got.keys() == want.keys() and torch.equal(got.values(), want.values())
    scripted = torch.jit.script(symbolic_trace(sharded))
    assert torch.equal(scripted(batch).values(), want.values())


@pytest.mark.parametrize("kernel", kernel_params())
def test_sharded_dlrm_and_assignment(kernel: str) -> None:
    q = quantize(dlrm(), "int8")
    sharded = shard_for_inference(q, devices=2, assignment={"t0": 1, "t1": 1, "t2": 1}, kernel_backend=kernel)
    collection = sharded.sparse_arch.embedding_bag_collection
    assert collection.group_devices() == ["cpu"]  # every table on device 1 -> one group
    dense, batch = torch.randn(5, 5), kjt()
    assert torch.equal(sharded(dense, batch), q(dense, batch))
    assert isinstance(q.sparse_arch.embedding_bag_collection, lightrec.inference.QuantEmbeddingBagCollection)


def test_capacity_and_argument_errors() -> None:
    q = quantize(lightrec.EmbeddingBagCollection(tables()), "int8")
    with pytest.raises(ValueError, match="does not fit"):
        shard_for_inference(q, devices=2, max_bytes_per_device=700)
    fits = shard_for_inference(q, devices=2, max_bytes_per_device=1000, kernel_backend="torch")
    assert len(fits.lookups) == 3
    with pytest.raises(ValueError, match="placement"):
        shard_for_inference(q, devices=1, placement="disk")
    with pytest.raises(ValueError, match="quantize it first"):
        shard_for_inference(torch.nn.Sequential(torch.nn.Linear(2, 2)), devices=1)


def test_shard_modules_torchrec_call_shape() -> None:
    from lightrec.distributed import ShardingEnv

    holder = torch.nn.Sequential(quantize(lightrec.EmbeddingBagCollection(tables()), "int8"))
    batch = kjt()
    want = holder(batch).values()
    out = shard_modules(module=holder, device=torch.device("cpu"), env=ShardingEnv.from_local(2, 0))
    assert out is holder and isinstance(holder[0], ShardedQuantEmbeddingBagCollection)
    assert torch.equal(holder(batch).values(), want)


@pytest.mark.parametrize("kernel", kernel_params())
def test_sharded_groups_reject_bad_ids_like_the_unsharded_collection(kernel: str) -> None:
    q = quantize(lightrec.EmbeddingBagCollection(tables()), "int8")
    sharded = shard_for_inference(q, devices=2, kernel_backend=kernel)
    bad = lightrec.KeyedJaggedTensor(keys=["f0", "f1", "f2", "f3"], values=torch.tensor([1, 2, 31, 0]),
                                     lengths=torch.tensor([1, 1, 1, 1]))
    with pytest.raises(IndexError, match=r"feature 'f2' \(sample 0\) has id 31 but table 't1' has 31 rows"):
        sharded(bad)
