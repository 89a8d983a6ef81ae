"""From training to serving: a DMP's versions written by ``publish_changes`` (int8 rows, dense weights),
followed by ``lightrec.serving.deltas.DeltaFollower`` into an artifact exported at the start, make it
score exactly as a fresh export of the trained model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.deltas import publish_changes
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from lightrec.inference import export, load, quantize, unshard
    from lightrec.models import DLRM
    from lightrec.serving.deltas import DeltaFollower

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name="t0", num_embeddings=1000, embedding_dim=16, feature_names=["f0"])]
    dmp = DistributedModelParallel(DLRM(EmbeddingBagCollection(tables, device="meta"), dense_in_features=4,
                                        dense_arch_layer_sizes=[16], over_arch_layer_sizes=[8, 1]))  # fmt: skip
    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig())
    folder = f"{tmp}/publish"
    publish_changes(dmp, folder, tracker, row_format="int8")
    predictor = load(export(quantize(unshard(dmp.module), dtype="int8"), f"{tmp}/model.pt"))
    follower = DeltaFollower(folder, poll_interval_s=2.0)
    first = follower.poll()
    assert first is not None
    first.apply(predictor)
    dense = torch.optim.SGD([p for n, p in dmp.named_parameters() if "embedding_bags" not in n], lr=0.1)
    for step in range(1, 5):
        sparse = KeyedJaggedTensor(["f0"], torch.tensor([3, 7, 3 + step]), lengths=torch.tensor([2, 1]))
        dmp(torch.randn(2, 4), sparse).sum().backward()
        dense.step()
        dense.zero_grad()
        if step % 2 == 0:
            publish_changes(dmp, folder, tracker, global_step=step, dense=step == 4, row_format="int8")
    update = follower.poll(force=True)
    assert update is not None
    update.apply(predictor)
    x = torch.randn(3, 4)
    kjt = KeyedJaggedTensor(["f0"], torch.tensor([3, 5, 6, 7, 9]), lengths=torch.tensor([2, 1, 2]))
    fresh = quantize(unshard(dmp.module), dtype="int8").eval()
    return {"versions": list(update.versions), "served": predictor(x, kjt.values(), kjt.lengths()),
            "fresh": fresh(x, kjt)}  # fmt: skip


def test_served_artifact_follows_the_published_versions_exactly(tmp_path: Path) -> None:
    result = run_ranks(_body, 1, args=(str(tmp_path),), timeout=300)[0]
    assert result["versions"] == [2, 3]
    assert torch.equal(result["served"].reshape(-1), result["fresh"].reshape(-1))
