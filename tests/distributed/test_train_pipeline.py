"""TrainPipelineSparseDist / EvalPipelineSparseDist / TrainPipelineBase on 2 gloo ranks: per-step
losses and trained tables identical to an unpipelined loop over the same batches, StopIteration at
the end of the data, models with several collections, and models that rebuild their features."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch import nn

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.datasets.random import RandomRecDataset
from tests.multiprocess import run_ranks

KEYS = ["f0", "f1", "f2"]
STEPS = 6


def _dlrm_dmp(world_size: int):  # noqa: ANN202
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.types import ShardingPlan
    from lightrec.models.dlrm import DLRM, DLRMTrain
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=40, embedding_dim=8, feature_names=[k])
              for i, k in enumerate(KEYS)]  # fmt: skip
    ebc = EmbeddingBagCollection(tables, device="meta")
    model = DLRMTrain(DLRM(ebc, dense_in_features=4, dense_arch_layer_sizes=[8, 8], over_arch_layer_sizes=[8, 1]))
    plan = ShardingPlan({"model.sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
        ebc, {"t0": table_wise(0), "t1": table_wise(1), "t2": row_wise()}, world_size=world_size)})  # fmt: skip
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.05))  # fmt: skip
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def _loader(rank: int) -> RandomRecDataset:
    return RandomRecDataset(keys=KEYS, batch_size=8, hash_size=40, ids_per_features=[1, 2, 3], num_dense=4,
                            manual_seed=rank, num_batches=STEPS, num_generated_batches=-1)  # fmt: skip


def _plain(model: nn.Module, opt: torch.optim.Optimizer, batches: list) -> list[float]:
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _run(pipeline, it) -> list[float]:  # noqa: ANN001
    losses = []
    while True:
        try:
            output = pipeline.progress(it)  # the model's output: (loss, logits, ...)
        except StopIteration:
            return losses
        losses.append(float(output[0]))


def _body(rank: int, world_size: int) -> dict:
    from lightrec.distributed import gather_full_state_dict
    from lightrec.distributed.train_pipeline import (
        EvalPipelineSparseDist,
        TrainPipelineBase,
        TrainPipelineSparseDist,
    )

    out: dict = {}
    for kind in ("plain", "sparse_dist", "base", "stop_early"):
        model, opt = _dlrm_dmp(world_size)
        batches = list(_loader(rank))
        if kind == "plain":
            out[kind] = _plain(model, opt, batches)
        else:
            cpu = torch.device("cpu")
            if kind == "base":
                pipeline = TrainPipelineBase(model, opt, cpu)
            else:
                pipeline = TrainPipelineSparseDist(model, opt, cpu, execute_all_batches=kind == "sparse_dist")
            it = iter(batches)
            out[kind] = _run(pipeline, it)
            with pytest.raises(StopIteration):
                pipeline.progress(it)
        out[kind + "_tables"] = gather_full_state_dict(model.state_dict())
        if kind == "sparse_dist":
            model.eval()
            with torch.no_grad():
                want = [model(b)[1][1] for b in batches]
                got = []
                evaluator = EvalPipelineSparseDist(model, opt, torch.device("cpu"))
                it = iter(batches)
                while True:
                    try:
                        got.append(evaluator.progress(it)[1])
                    except StopIteration:
                        break
            out["eval_equal"] = len(got) == STEPS and all(torch.equal(a, b) for a, b in zip(want, got))
    return out


def test_pipelines_train_like_the_plain_loop() -> None:
    for res in run_ranks(_body, world_size=2, timeout=300):
        assert len(res["plain"]) == STEPS
        assert res["sparse_dist"] == res["plain"] and res["base"] == res["plain"]  # bit-identical losses
        assert 0 < len(res["stop_early"]) < STEPS and res["stop_early"] == res["plain"][: len(res["stop_early"])]
        for key, value in res["plain_tables"].items():
            assert torch.equal(res["sparse_dist_tables"][key], value), key
            assert torch.equal(res["base_tables"][key], value), key
        assert res["eval_equal"]


@dataclasses.dataclass
class _TwoFeatureBatch:
    """A batch with two KJTs (user side, item side) and labels."""

    user: KeyedJaggedTensor
    item: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> _TwoFeatureBatch:
        return _TwoFeatureBatch(self.user.to(device), self.item.to(device), self.labels.to(device))


class _TwoTowers(nn.Module):
    def __init__(self, rebuild: bool) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.users = EmbeddingBagCollection([EmbeddingBagConfig(name="u", num_embeddings=30, embedding_dim=4,
                                                                feature_names=["uid"])], device="meta")  # fmt: skip
        self.items = EmbeddingBagCollection([EmbeddingBagConfig(name="i", num_embeddings=30, embedding_dim=4,
                                                                feature_names=["iid", "cat"])], device="meta")  # fmt: skip
        self.rebuild = rebuild

    def forward(self, batch: _TwoFeatureBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        item = batch.item
        if self.rebuild:  # new tensors: the input dist started for the batch's KJT cannot be used
            item = KeyedJaggedTensor(keys=item.keys(), values=item.values().clone(), lengths=item.lengths().clone())
        u = self.users(batch.user).wait().values()
        i = self.items(item).wait().values()
        logits = (u * (i[:, :4] + i[:, 4:])).sum(dim=1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


def _two_tower_batches(rank: int) -> list[_TwoFeatureBatch]:
    g = torch.Generator().manual_seed(rank)
    out = []
    for _ in range(4):
        user = KeyedJaggedTensor(keys=["uid"], values=torch.randint(0, 30, (6,), generator=g), lengths=torch.ones(6, dtype=torch.int64))
        item = KeyedJaggedTensor(keys=["iid", "cat"], values=torch.randint(0, 30, (12,), generator=g),
                                 lengths=torch.full((12,), 1))  # fmt: skip
        out.append(_TwoFeatureBatch(user, item, torch.randint(0, 2, (6,), generator=g).float()))
    return out


def _two_tower_body(rank: int, world_size: int, rebuild: bool) -> dict:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.train_pipeline import TrainPipelineSparseDist
    from lightrec.optim import CombinedOptimizer

    results = {}
    for kind in ("plain", "pipelined"):
        model = DistributedModelParallel(_TwoTowers(rebuild), device=torch.device("cpu"))
        opt = CombinedOptimizer([model.fused_optimizer])
        batches = _two_tower_batches(rank)
        if kind == "plain":
            results[kind] = _plain(model, opt, batches)
        else:
            results[kind] = _run(TrainPipelineSparseDist(model, opt, torch.device("cpu")), iter(batches))
    return results


@pytest.mark.parametrize("rebuild", [False, True], ids=["same_kjts", "model_rebuilds_kjt"])
def test_several_collections_and_rebuilt_features(rebuild: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        for res in run_ranks(_two_tower_body, world_size=2, args=(rebuild,), timeout=240):
            assert len(res["plain"]) == 4 and res["pipelined"] == res["plain"]
