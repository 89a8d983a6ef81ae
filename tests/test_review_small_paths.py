"""torchrec user code on lightrec's small paths: ``torchrec.test_utils`` and
the names of ``torchrec.distributed.types`` that describe a sharded tensor's shards."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


def test_distributed_types_offers_the_shard_view_names_torchrec_code_imports() -> None:
    """torchrec's sharding code does ``from torchrec.distributed.types import Shard,
    ShardedTensorMetadata, TensorProperties, GetItemLazyAwaitable``; each is what lightrec's
    ``ShardedTensor`` view returns (``local_shards()`` / ``metadata()``)."""
    from lightrec.distributed import types
    from lightrec.distributed.types import (
        GetItemLazyAwaitable,
        LazyNoWait,
        Shard,
        ShardedTensor,
        ShardedTensorMetadata,
        ShardMetadata,
        TensorProperties,
    )

    meta = ShardMetadata([0, 0], [2, 3], "rank:0/cpu")
    rows = torch.arange(6.0).reshape(2, 3)
    value = ShardedTensor(global_shape=[4, 3], shards=[(meta, rows)], dtype=torch.float32)
    (shard,) = value.local_shards()
    assert isinstance(shard, Shard) and shard.metadata == meta and shard.tensor is rows
    md = value.metadata()
    assert isinstance(md, ShardedTensorMetadata) and md.size == torch.Size([4, 3])
    assert md.tensor_properties == TensorProperties(dtype=torch.float32)
    item = GetItemLazyAwaitable(LazyNoWait({"a": torch.tensor([7.0])}), "a")
    assert torch.equal(item.wait(), torch.tensor([7.0]))
    for name in ("GetItemLazyAwaitable", "Shard", "ShardedTensorMetadata", "TensorProperties"):
        assert name in types.__all__


# ------------------------------------------------------------------ torchrec.test_utils


def test_init_distributed_single_host_joins_and_sets_the_host_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrec's ``init_distributed_single_host(rank, world_size, backend, local_size=None)``."""
    from lightrec.distributed.comm.topology import get_local_rank, get_local_size
    from lightrec.test_utils import get_free_port, init_distributed_single_host

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(get_free_port()))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "99")  # overwritten by the helper; restored by monkeypatch
    monkeypatch.setenv("LOCAL_RANK", "99")
    try:
        pg = init_distributed_single_host(rank=0, world_size=1, backend="gloo")
        assert pg is dist.group.WORLD and dist.get_world_size(pg) == 1 and dist.get_rank(pg) == 0
        import os

        assert (os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("1", "0")
        assert get_local_size() == 1 and get_local_rank() == 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"rank": 0, "world_size": 0}, "world_size"),
        ({"rank": 0, "world_size": 2, "local_size": 0}, "local_size"),
    ],
)
def test_init_distributed_single_host_names_a_bad_argument(kwargs: dict, arg: str) -> None:
    from lightrec.test_utils import init_distributed_single_host

    with pytest.raises(ValueError, match=arg):
        init_distributed_single_host(backend="gloo", **kwargs)
    assert not dist.is_initialized()
