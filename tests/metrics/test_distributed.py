"""Cross-rank sync on 2 real gloo ranks: each metric equals the reference on the gathered data.

The ranks see different numbers of samples (and rank 1 sees no AUC data at all in one case), so the
uneven all_gather of the exact AUC's list states and the sum all_reduce of the others are both
exercised. One `run_ranks` call covers every metric to keep the test fast.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightrec.metrics import AUC, NE, RecallAtK, rec_metrics
from tests.metrics.references import auc_pairs, recall_at_k_random_ties
from tests.metrics.test_binary_metrics import make_data, reference
from tests.multiprocess import run_ranks

BATCHES_PER_RANK = {0: [40, 0, 97], 1: [23]}  # different sizes per rank, incl. an empty batch


def _body(rank: int, world_size: int) -> dict:
    sizes = BATCHES_PER_RANK[rank]
    preds, labels, weights = make_data(sum(sizes), seed=100 + rank, ties=True, weighted=True)
    g = torch.Generator().manual_seed(200 + rank)
    scores = torch.round(torch.randn(sum(sizes), 12, generator=g) * 2) / 2
    target = torch.randint(0, 12, (sum(sizes),), generator=g)

    collection = rec_metrics(prefix="val/")
    hist_auc = AUC(num_bins=16)
    recall = RecallAtK(k=3)
    for p, y, w, s, t in zip(
        preds.split(sizes),
        labels.split(sizes),
        weights.split(sizes),
        scores.split(sizes),
        target.split(sizes),
        strict=True,
    ):
        collection.update(p, y, w)
        hist_auc.update(p, y, w)
        recall.update(s, t)
    out = {
        "collection": {k: v.item() for k, v in collection.compute().items()},
        "hist_auc": hist_auc.compute().item(),
        "recall": recall.compute().item(),
        "data": (preds, labels, weights, scores, target),
    }

    # Rank 1 never updates: torchmetrics pads its empty list states; rank 0 alone defines the AUC.
    lonely = AUC()
    if rank == 0:
        lonely.update(preds, labels, weights)
    out["lonely_auc"] = lonely.compute().item()

    # Each rank holds one class only: undefined locally, defined once synced.
    one_class = AUC()
    one_class.update(preds, torch.full_like(labels, float(rank)))
    out["one_class_auc"] = one_class.compute().item()

    # compute() must restore local states: further updates keep accumulating and sync again.
    ne = NE()
    ne.update(preds, labels, weights)
    ne.compute()
    ne.update(preds, labels, weights)
    out["ne_twice"] = ne.compute().item()
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_body, world_size=2)


def gathered(results: list[dict], i: int) -> torch.Tensor:
    return torch.cat([r["data"][i] for r in results])


def test_all_ranks_agree(results) -> None:
    for key in ("collection", "hist_auc", "recall", "lonely_auc", "one_class_auc", "ne_twice"):
        assert results[0][key] == results[1][key], key


def test_binary_metrics_equal_reference_on_gathered_predictions(results) -> None:
    preds, labels, weights = gathered(results, 0), gathered(results, 1), gathered(results, 2)
    assert preds.numel() == 160
    for name in ("auc", "ne", "calibration", "ctr", "accuracy"):
        got = results[0]["collection"][f"val/{name}"]
        assert got == pytest.approx(reference(name, preds, labels, weights), rel=1e-6), name


def test_histogram_auc_and_recall_on_gathered_data(results) -> None:
    preds, labels, weights = gathered(results, 0), gathered(results, 1), gathered(results, 2)
    # make_data's ties put scores on a 1/16 grid, so 16 bins that hold the grid values apart would be exact;
    # grid value 1.0 and 15/16 share the top bin, so compare against the reference on bin indices.
    binned = np.minimum(np.floor(preds.double().numpy() * 16), 15)
    assert results[0]["hist_auc"] == pytest.approx(
        auc_pairs(binned, labels.double().numpy(), weights.double().numpy()), rel=1e-6
    )
    scores, target = gathered(results, 3), gathered(results, 4)
    assert results[0]["recall"] == pytest.approx(
        recall_at_k_random_ties(scores.numpy(), target.numpy(), 3), rel=1e-6
    )


def test_rank_without_data_and_one_class_per_rank(results) -> None:
    preds, labels, weights = results[0]["data"][:3]
    assert results[0]["lonely_auc"] == pytest.approx(
        auc_pairs(preds.numpy(), labels.numpy(), weights.numpy()), rel=1e-6
    )
    all_preds = gathered(results, 0)
    one_class_labels = torch.cat([torch.zeros(137), torch.ones(23)])
    assert results[0]["one_class_auc"] == pytest.approx(
        auc_pairs(all_preds.numpy(), one_class_labels.numpy()), rel=1e-6
    )


def test_compute_unsyncs_so_updates_keep_accumulating(results) -> None:
    preds, labels, weights = gathered(results, 0), gathered(results, 1), gathered(results, 2)
    twice = (torch.cat([preds, preds]), torch.cat([labels, labels]), torch.cat([weights, weights]))
    assert results[0]["ne_twice"] == pytest.approx(reference("ne", *twice), rel=1e-6)
