"""The TorchRec tutorial's distributed cells with ``torchrec`` replaced by ``lightrec`` (CPU, gloo, 1 rank).

Sections "Distributed Training and Sharding" to "Adding an Optimizer to EmbeddingBagCollection" of
``../shared/seeds/intro-to-torchrec-tutorial.txt``: sharder -> planner -> ``collective_plan`` ->
``sharder.shard`` -> awaitable output -> ``DistributedModelParallel(ebc, device=...)`` -> fused
optimizers through ``fused_params`` and through ``apply_optimizer_in_backward``. The device is
``cpu`` instead of ``cuda``; everything else is the TorchRec tutorial's code. The printed module trees must
contain the TorchRec tutorial's structure, in the TorchRec tutorial's order.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from tests.multiprocess import run_ranks

SHARDED_TREE = [
    "ShardedEmbeddingBagCollection(",
    "(lookups):",
    "GroupedPooledEmbeddingsLookup(",
    "(_emb_modules): ModuleList(",
    "(0): BatchedEmbeddingBag(",
    "(_output_dists):",
    "TwPooledEmbeddingDist(",
    "(embedding_bags): ModuleDict(",
    "(product_table): Module()",
    "(user_table): Module()",
]
DMP_TREE = [
    "DistributedModelParallel(",
    "(_dmp_wrapped_module): ShardedEmbeddingBagCollection(",
    "(lookups):",
    "GroupedPooledEmbeddingsLookup(",
    "(_input_dists):",
    "TwSparseFeaturesDist(",
    "(_output_dists):",
    "TwPooledEmbeddingDist(",
    "(embedding_bags): ModuleDict(",
]
OPTIMIZER_LINES = """\
Original Sharded EBC fused optimizer: : EmbeddingFusedOptimizer (
Parameter Group 0
lr: 0.01
)
Sharded EBC with fused parameters fused optimizer: : EmbeddingFusedOptimizer (
Parameter Group 0
lr: 0.02
)
Type of optimizer: <class 'lightrec.optim.keyed.CombinedOptimizer'>
name='embedding_bags.product_table.weight'
name='embedding_bags.user_table.weight'
: EmbeddingFusedOptimizer (
Parameter Group 0
lr: 0.5
)
<class 'lightrec.optim.keyed.CombinedOptimizer'>
Non Fused Model Parameters:
dict_keys([])"""


def _cells(rank: int, world_size: int) -> dict[str, Any]:  # noqa: PLR0915 - the TorchRec tutorial's cells, in order
    import copy

    import torch
    import torch.distributed as dist

    import lightrec as torchrec
    from lightrec import JaggedTensor, KeyedJaggedTensor

    ebc = torchrec.EmbeddingBagCollection(
        device="cpu",
        tables=[
            torchrec.EmbeddingBagConfig(name="product_table", embedding_dim=64, num_embeddings=4096,
                                        feature_names=["product"], pooling=torchrec.PoolingType.SUM),
            torchrec.EmbeddingBagConfig(name="user_table", embedding_dim=64, num_embeddings=4096,
                                        feature_names=["user"], pooling=torchrec.PoolingType.SUM),
        ],
    )  # fmt: skip
    product_jt = JaggedTensor(values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1]))
    user_jt = JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2]))
    kjt = KeyedJaggedTensor.from_jt_dict({"product": product_jt, "user": user_jt})
    out: dict[str, Any] = {}
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        # --- "Distributed Embeddings" / "Planner" / "Planner Result"
        from lightrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from lightrec.distributed.types import ShardingEnv

        sharder = EmbeddingBagCollectionSharder()
        pg = dist.GroupMember.WORLD
        assert pg is not None, "Process group is not initialized"
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"))
        plan = planner.collective_plan(ebc, [sharder], pg)
        out["plan"] = str(plan)
        env = ShardingEnv.from_process_group(pg)
        sharded_ebc = sharder.shard(ebc, plan.plan[""], env, torch.device("cpu"))
        out["sharded_tree"] = repr(sharded_ebc)

        # --- "GPU Training with LazyAwaitable"
        from lightrec.distributed import LazyAwaitable

        class ExampleAwaitable(LazyAwaitable[torch.Tensor]):
            def __init__(self, size: list[int]) -> None:
                super().__init__()
                self._size = size

            def _wait_impl(self) -> torch.Tensor:
                return torch.ones(self._size)

        awaitable = ExampleAwaitable([3, 2])
        out["example"] = awaitable.wait()
        output = sharded_ebc(kjt)
        out["output_type"] = type(output).__name__
        kt = output.wait()
        out["kt"] = (type(kt).__name__, kt.keys(), tuple(kt.values().shape),
                     {k: tuple(v.shape) for k, v in kt.to_dict().items()})  # fmt: skip
        out["matches_ebc"] = torch.equal(kt.values(), ebc(kjt).values())

        # --- "DistributedModelParallel"
        model = torchrec.distributed.DistributedModelParallel(ebc, device=torch.device("cpu"))
        dmp_out = model(kjt)
        out["dmp_values"] = torch.equal(dmp_out.wait().values(), ebc(kjt).values())
        out["dmp_tree"] = repr(model)

    opt_text = io.StringIO()
    with contextlib.redirect_stdout(opt_text):
        # --- "Adding an Optimizer to EmbeddingBagCollection"
        from lightrec.optim import EmbOptimType, in_backward_optimizer_filter

        fused_params = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.02, "eps": 0.002}
        sharder_with_fused_params = EmbeddingBagCollectionSharder(fused_params=fused_params)
        sharded_ebc_fused_params = sharder_with_fused_params.shard(
            ebc, plan.plan[""], env, torch.device("cpu")
        )
        print(f"Original Sharded EBC fused optimizer: {sharded_ebc.fused_optimizer}")
        print(
            f"Sharded EBC with fused parameters fused optimizer: {sharded_ebc_fused_params.fused_optimizer}"
        )
        print(f"Type of optimizer: {type(sharded_ebc_fused_params.fused_optimizer)}")
        from lightrec.optim import apply_optimizer_in_backward

        ebc_apply_opt = copy.deepcopy(ebc)
        optimizer_kwargs = {"lr": 0.5}
        for name, param in ebc_apply_opt.named_parameters():
            print(f"{name=}")
            apply_optimizer_in_backward(torch.optim.SGD, [param], optimizer_kwargs)
        sharded_ebc_apply_opt = sharder.shard(ebc_apply_opt, plan.plan[""], env, torch.device("cpu"))
        print(sharded_ebc_apply_opt.fused_optimizer)
        print(type(sharded_ebc_apply_opt.fused_optimizer))
        print("Non Fused Model Parameters:")
        print(dict(in_backward_optimizer_filter(sharded_ebc_fused_params.named_parameters())).keys())
        ebc_output = sharded_ebc_fused_params(kjt).wait().values()
        loss = torch.sum(torch.ones_like(ebc_output) - ebc_output)
        first = loss.item()
        loss.backward()
        ebc_output = sharded_ebc_fused_params(kjt).wait().values()
        loss = torch.sum(torch.ones_like(ebc_output) - ebc_output)
        out["losses"] = (first, loss.item())
    out["optimizer_text"] = opt_text.getvalue()
    out["stdout"] = text.getvalue()
    return out


def _normalise(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", ln.strip()) for ln in text.splitlines() if ln.strip()]


def _in_order(tree: str, expected: list[str]) -> None:
    lines = _normalise(tree)
    pos = 0
    for want in expected:
        found = next((i for i in range(pos, len(lines)) if lines[i].startswith(want)), None)
        assert found is not None, f"{want!r} not found (in order) in:\n{tree}"
        pos = found + 1


def test_tutorial_distributed_cells_run_on_cpu_gloo() -> None:
    import torch

    (out,) = run_ranks(_cells, 1, timeout=180)
    assert out["stdout"] == ""
    assert "product_table | table_wise" in out["plan"] and "user_table | table_wise" in out["plan"]
    _in_order(out["sharded_tree"], SHARDED_TREE)
    _in_order(out["dmp_tree"], DMP_TREE)
    assert torch.equal(out["example"], torch.ones(3, 2))
    assert out["output_type"] == "EmbeddingBagCollectionAwaitable"
    assert out["kt"] == ("KeyedTensor", ["product", "user"], (2, 128), {"product": (2, 64), "user": (2, 64)})
    assert out["matches_ebc"] and out["dmp_values"]  # sharding kept the module's weights
    assert _normalise(out["optimizer_text"])[: len(_normalise(OPTIMIZER_LINES))] == _normalise(
        OPTIMIZER_LINES
    )
    first, second = out["losses"]
    # loss = sum(1 - e) has gradient -1 for every output: the update inside backward raises the
    # looked-up rows, so the second forward (no optimizer.step()) gives a lower loss, as in the TorchRec tutorial.
    assert second < first - 1.0
