"""``publish_changes`` on 2 gloo ranks: what the published chain must hold beyond the tables' changed rows.

* A sharded ``FeatureProcessedEmbeddingBagCollection``'s position weights are dense weights (the dense
  optimizer trains them, every rank keeps them whole): snapshots and ``dense=True`` deltas carry them,
  under the unsharded model's names, as ``publish.dense_weights`` does for an unsharded model. They
  used to be skipped with the whole sharded collection.
* A tracker's first read covers only the rows changed since it was built. Into a folder that already
  holds versions (a restarted trainer, another process) it is therefore a snapshot, whatever
  ``snapshot=`` says: a delta from it left every row trained before the tracker existed at the
  folder's old values (reproduced: 5 of 1000 rows stale in every later version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.multiprocess import run_ranks


class _PositionWeighted(nn.Module):
    """A feature-processed collection (two tables, row-wise and table-wise) under a linear layer."""

    def __init__(self) -> None:
        from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
        from lightrec.modules.feature_processor_ import PositionWeightedModule
        from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

        super().__init__()
        tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=40, embedding_dim=4, feature_names=[f"f{i}"])
                  for i in range(2)]  # fmt: skip
        ebc = EmbeddingBagCollection(tables, is_weighted=True, device="meta")
        self.fp = FeatureProcessedEmbeddingBagCollection(ebc, {f"f{i}": PositionWeightedModule(4) for i in range(2)})
        self.over = nn.Linear(8, 1)

    def forward(self, kjt: Any) -> torch.Tensor:
        return self.over(self.fp(kjt).wait().values()).squeeze(1)


def _batch(step: int, rank: int, offset: int = 0) -> Any:
    from lightrec import KeyedJaggedTensor

    ids = (torch.arange(8) * 5 + step + 3 * rank + offset) % 40
    return KeyedJaggedTensor(["f0", "f1"], ids, lengths=torch.tensor([3, 1, 2, 2]))


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder
    from lightrec.distributed.deltas import DeltaReader, publish_changes
    from lightrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from lightrec.distributed.model_tracker import DeltaTrackerConfig, ModelDeltaTrackerTrec
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.types import ShardingPlan
    from lightrec.optim import EmbOptimType

    torch.manual_seed(0)
    model = _PositionWeighted()
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
    plan = ShardingPlan({"fp": construct_module_sharding_plan(
        model.fp, {"t0": row_wise(), "t1": table_wise(rank=1)}, world_size=world_size)})  # fmt: skip
    sharders = [FeatureProcessedEmbeddingBagCollectionSharder(fused), EmbeddingBagCollectionSharder(fused)]
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if "_feature_processors" in n or ".over." in f".{n}"]
    optimizer = torch.optim.SGD(dense, lr=0.5)

    def train(step: int, offset: int = 0) -> None:
        dmp(_batch(step, rank, offset)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    def model_state() -> dict[str, Any]:
        full = dmp.gather_full_state_dict(dst=0)  # collective
        return {k: v.float().clone() for k, v in full.items()}

    folder = f"{tmp}/publish"
    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    first = publish_changes(dmp, folder, tracker, consumer="publish")
    for step in range(3):
        train(step)
    delta = publish_changes(dmp, folder, tracker, consumer="publish", dense=True, global_step=3)
    trained = model_state()
    # The trainer "restarts": rows trained before its new tracker exists, then a publish asking for a delta.
    for step in range(3, 5):
        train(step, offset=17)
    fresh = ModelDeltaTrackerTrec(dmp, consumers=["publish"])  # the restarted trainer's
    train(5)
    restarted = publish_changes(dmp, folder, fresh, consumer="publish", snapshot=False, global_step=6)
    train(6)
    after = publish_changes(dmp, folder, fresh, consumer="publish", dense=True, global_step=7)
    final = model_state()
    if rank != 0:
        return {}
    reader = DeltaReader(folder)
    return {
        "kinds": [reader.manifest(v).kind for v in (first, delta, restarted, after)],
        "first_dense": reader.read(first).dense,
        "delta": reader.state(delta),
        "trained": trained,
        "final_state": reader.state(after),
        "final": final,
    }


def test_position_weights_are_published_and_a_first_read_into_a_used_folder_is_a_snapshot(tmp_path: Path) -> None:
    got = run_ranks(_body, world_size=2, args=(str(tmp_path),), timeout=300)[0]
    assert got["kinds"] == ["snapshot", "delta", "snapshot", "delta"]
    keys = {f"fp._feature_processors.f{i}.position_weight" for i in range(2)}
    assert keys <= set(got["first_dense"]), sorted(got["first_dense"])
    for state, model in ((got["delta"], got["trained"]), (got["final_state"], got["final"])):
        for key in keys | {"over.weight", "over.bias"}:
            torch.testing.assert_close(state.dense[key], model[key], rtol=0, atol=0)
        for t in ("t0", "t1"):
            torch.testing.assert_close(state.rows[t].values, model[f"fp._embedding_bag_collection.embedding_bags.{t}.weight"],
                                       rtol=0, atol=0)  # fmt: skip
    # the position weights did train (a test of nothing otherwise)
    assert not torch.equal(got["trained"]["fp._feature_processors.f0.position_weight"], torch.ones(4))
