"""The Triton backend under the collections: fused EBC / EC on one process, sharded EBC on gloo ranks.

Each case trains the same module on the torch backend and on the Triton backend and compares
outputs, tables and optimizer state (``tests/triton_support.py`` says where the kernels run).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec.data import SyntheticCriteoDataset
from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.sparse import KeyedJaggedTensor
from tests.multiprocess import run_ranks
from tests.triton_support import DEVICE, requires_triton

pytestmark = requires_triton


def _same_module_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        torch.testing.assert_close(sb[key], sa[key], rtol=1e-5, atol=1e-6)
    oa, ob = a.fused_optimizer.state_dict(), b.fused_optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    for name in oa["state"]:
        for key, value in oa["state"][name].items():
            torch.testing.assert_close(
                torch.as_tensor(ob["state"][name][key]).cpu(), torch.as_tensor(value).cpu()
            )


@pytest.mark.parametrize("weighted", [False, True])
def test_fused_ebc_trains_like_the_torch_backend(weighted: bool) -> None:
    """Criteo-like batches (power-law ids, so many repeats), SUM and MEAN tables (two lookups)."""
    data = SyntheticCriteoDataset(batch_size=16, num_batches=3, num_embeddings_cap=60, ids_per_feature=2)
    tables = data.table_configs(8)
    for t in tables[::3]:
        t.pooling = PoolingType.MEAN
    params = {
        "optimizer": "adam",
        "learning_rate": 0.05,
        "weight_decay": 0.01,
        "weight_decay_mode": "decoupled",
    }
    torch.manual_seed(0)
    ref = FusedEmbeddingBagCollection(
        tables, fused_params=params, is_weighted=weighted, device=DEVICE, kernel_backend="torch"
    )
    tri = FusedEmbeddingBagCollection(
        tables, fused_params=params, is_weighted=weighted, device=DEVICE, kernel_backend="triton"
    )
    tri.load_state_dict(ref.state_dict())
    assert {lk.backend_name for lk in tri._lookups} == {"triton"} and len(tri._lookups) == 2
    gen = torch.Generator().manual_seed(1)
    for i in range(3):
        kjt = data[i].sparse_features
        if weighted:
            kjt = KeyedJaggedTensor(
                kjt.keys(), kjt.values(), torch.rand(kjt.values().numel(), generator=gen), kjt.lengths()
            )
        kjt = kjt.to(DEVICE)
        out_ref, out_tri = ref(kjt), tri(kjt)
        assert out_tri.keys() == out_ref.keys()
        torch.testing.assert_close(out_tri.values(), out_ref.values(), rtol=1e-5, atol=1e-6)
        scale = torch.randn(out_ref.values().shape, generator=gen).to(DEVICE)
        (out_ref.values() * scale).sum().backward()
        (out_tri.values() * scale).sum().backward()
    _same_module_state(ref, tri)


def test_fused_ec_trains_like_the_torch_backend() -> None:
    tables = [
        EmbeddingConfig(num_embeddings=9, embedding_dim=4, name="u", feature_names=["u1", "u2"]),
        EmbeddingConfig(num_embeddings=7, embedding_dim=4, name="v", feature_names=["v"]),
    ]
    params = {"optimizer": "exact_adagrad", "learning_rate": 0.1}
    torch.manual_seed(0)
    ref = FusedEmbeddingCollection(tables, fused_params=params, device=DEVICE, kernel_backend="torch")
    tri = FusedEmbeddingCollection(tables, fused_params=params, device=DEVICE, kernel_backend="triton")
    tri.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        lengths = torch.randint(0, 4, (9,), generator=gen)
        values = torch.randint(0, 7, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor(["v", "u1", "u2"], values, lengths=lengths).to(DEVICE)
        out_ref, out_tri = ref(kjt), tri(kjt)
        loss_ref = loss_tri = 0
        for f in out_ref:
            torch.testing.assert_close(out_tri[f].values(), out_ref[f].values())
            w = torch.randn(out_ref[f].values().shape, generator=gen).to(DEVICE)
            loss_ref = loss_ref + (out_ref[f].values() * w).sum()
            loss_tri = loss_tri + (out_tri[f].values() * w).sum()
        loss_ref.backward()
        loss_tri.backward()
    _same_module_state(ref, tri)


def _sharded_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import column_wise, construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(num_embeddings=13, embedding_dim=8, name="A", feature_names=["a1", "a2"]),
        EmbeddingBagConfig(
            num_embeddings=5, embedding_dim=4, name="B", feature_names=["b"], pooling=PoolingType.MEAN
        ),
        EmbeddingBagConfig(num_embeddings=11, embedding_dim=8, name="C", feature_names=["c"]),
    ]
    out: dict[str, Any] = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(configs)
        generators = {"A": row_wise(), "B": table_wise(rank=1), "C": column_wise(ranks=[0, 1])}
        plan = construct_module_sharding_plan(ebc, generators, world_size=world_size)
        sharder = EmbeddingBagCollectionSharder(
            {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.2}, kernel_backend=backend
        )
        sharded = sharder.shard(ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD))
        gen = torch.Generator().manual_seed(10 + rank)
        steps = []
        for _ in range(3):
            lengths = torch.randint(0, 4, (4 * 3,), generator=gen)
            values = torch.cat([torch.randint(0, n, (int(lengths[4 * i : 4 * i + 4].sum()),), generator=gen)
                                for i, n in enumerate([13, 13, 5])])  # fmt: skip
            lengths = torch.cat([lengths, torch.ones(4, dtype=torch.long)])
            values = torch.cat([values, torch.randint(0, 11, (4,), generator=gen)])
            kjt = KeyedJaggedTensor(["a1", "a2", "b", "c"], values, lengths=lengths)
            pooled = sharded(kjt).wait().values()
            (pooled * torch.linspace(-1, 1, pooled.numel()).view_as(pooled)).sum().backward()
            steps.append(pooled.detach())
        kernels = sorted({m.backend_name for m in sharded.modules() if hasattr(m, "backend_name")})
        out[backend] = {"kernels": kernels, "steps": steps}
    return out


def test_sharded_ebc_with_triton_kernels_trains_like_torch_kernels() -> None:
    """Row-, table- and column-wise shards on 2 gloo ranks, ``kernel_backend="triton"``."""
    if DEVICE.type != "cpu":
        pytest.skip("the gloo test runs the Triton kernels on CPU tensors (TRITON_INTERPRET=1)")
    for rank_result in run_ranks(_sharded_body, world_size=2, timeout=300):
        assert rank_result["triton"]["kernels"] == ["triton"] and rank_result["torch"]["kernels"] == ["torch"]
        for got, expected in zip(rank_result["triton"]["steps"], rank_result["torch"]["steps"], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
