"""The sharders' (and RecStrategy's) ``kernel_backend`` picks the lookup kernels of every shard."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from lightrec.sparse import KeyedJaggedTensor

    configs = [EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name=f"t{i}", feature_names=[f"f{i}"])
               for i in range(2)]  # fmt: skip
    kjt = KeyedJaggedTensor(["f0", "f1"], torch.tensor([1, 2, 3, 19, 0]), lengths=torch.tensor([2, 1, 1, 1]))
    out: dict[str, Any] = {}
    backends = ["auto", "torch"] + (["fbgemm"] if fbgemm_available() else [])
    for backend in backends:
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(configs)
        plan = construct_module_sharding_plan(ebc, {"t0": row_wise(), "t1": table_wise(rank=0)}, world_size=world_size)
        sharder = EmbeddingBagCollectionSharder({"optimizer": "exact_row_wise_adagrad"}, kernel_backend=backend)
        sharded = sharder.shard(ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD))
        kernels = [m for m in sharded.modules() if hasattr(m, "backend_name")]
        out[backend] = {"kernels": sorted({k.backend_name for k in kernels}), "values": sharded(kjt).wait().values()}
        out["reference"] = ebc(kjt).values()
    return out


def test_kernel_backend_reaches_every_shard_and_outputs_agree() -> None:
    result = run_ranks(_body, 1, timeout=120)[0]
    assert result["torch"]["kernels"] == ["torch"]
    if fbgemm_available():
        assert result["fbgemm"]["kernels"] == ["fbgemm"]
        assert result["auto"]["kernels"] == ["fbgemm"]
    for backend in [b for b in result if b != "reference"]:
        torch.testing.assert_close(result[backend]["values"], result["reference"])


def test_bad_kernel_backend_is_rejected_by_sharders_and_strategy() -> None:
    from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
    from lightrec.lightning import RecStrategy

    for make in (EmbeddingBagCollectionSharder, EmbeddingCollectionSharder):
        with pytest.raises(ValueError, match=r"kernel_backend must be one of \('auto', 'fbgemm', .*'torch', 'triton'\).*'cuda'"):
            make(kernel_backend="cuda")
    with pytest.raises(ValueError, match="kernel_backend must be one of"):
        RecStrategy(kernel_backend="tbe")
    from lightrec.lightning.contracts import ShardingRequest

    sharders = RecStrategy(kernel_backend="torch")._sharders_for(ShardingRequest())
    assert [s.kernel_backend for s in sharders] == ["torch"] * 6  # EBC, EC, FP-EBC, fused EBC, MC EBC, MC EC
