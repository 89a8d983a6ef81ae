"""``SlidingWindow``: a metric over the newest ``window`` samples equals the plain metric of exactly those samples."""

from __future__ import annotations

import math

import pytest
import torch

from lightrec.metrics import SlidingWindow, UnknownMetricError
from tests.multiprocess import run_ranks


def rank_auc(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """AUC by ranking (Mann-Whitney U): the share of (positive, negative) pairs ordered right, ties one half."""
    pos, neg = preds[labels == 1].double(), preds[labels == 0].double()
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (pos.numel() * neg.numel()))


def plain_ne(preds: torch.Tensor, labels: torch.Tensor) -> float:
    p, y = preds.double().clamp(1e-12, 1 - 1e-12), labels.double()  # NE's clamp keeps a sure miss finite
    logloss = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    ctr = y.mean()
    return float(logloss / -(ctr * ctr.log() + (1 - ctr) * (1 - ctr).log()))


def _batches(n: int, size: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        labels = (torch.rand(size, generator=g) < 0.3).float()
        preds = ((0.3 * labels + 0.7 * torch.rand(size, generator=g)) * 20).round() / 20  # ties: one half each
        preds = preds.clamp(0.01, 0.99)
        out.append((preds, labels))
    return out


@pytest.mark.parametrize("window", [1, 7, 40, 64, 500])
def test_the_window_holds_exactly_the_newest_samples(window: int) -> None:
    auc, ne = SlidingWindow("auc", window=window), SlidingWindow("ne", window=window)
    seen_p: list[torch.Tensor] = []
    seen_y: list[torch.Tensor] = []
    for preds, labels in _batches(9, 16):  # batches smaller, equal and larger than the window
        auc.update(preds, labels)
        ne.update(preds, labels)
        seen_p.append(preds)
        seen_y.append(labels)
        p, y = torch.cat(seen_p)[-window:], torch.cat(seen_y)[-window:]
        if 0 < y.sum() < y.numel():
            assert float(auc.compute()) == pytest.approx(rank_auc(p, y), abs=1e-6)
            assert float(ne.compute()) == pytest.approx(plain_ne(p, y), rel=1e-5)
    assert int(auc.window_seen) == 9 * 16


def test_a_batch_larger_than_the_window_keeps_its_newest_samples() -> None:
    (preds, labels), *_ = _batches(1, 100, seed=3)
    metric = SlidingWindow("auc", window=30)
    metric.update(preds, labels)
    assert float(metric.compute()) == pytest.approx(rank_auc(preds[-30:], labels[-30:]), abs=1e-6)


def test_calling_the_window_updates_it_and_keeps_its_size() -> None:
    metric = SlidingWindow("ctr", window=10)
    batches = _batches(3, 8)
    for preds, labels in batches:
        metric(preds, labels)
    assert metric.window_preds.shape == (10,)
    assert float(metric.compute()) == pytest.approx(float(torch.cat([y for _, y in batches])[-10:].mean()))


def test_an_empty_window_is_nan_and_bad_arguments_name_themselves() -> None:
    with pytest.warns(UserWarning):
        assert math.isnan(float(SlidingWindow("auc", window=4).compute()))
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        SlidingWindow("auc", window=0)
    with pytest.raises(UnknownMetricError, match="'recall'"):
        SlidingWindow("recall", window=4)
    metric = SlidingWindow("auc", window=4)
    metric.update(torch.rand(4), torch.ones(4))
    metric.reset()
    assert int(metric.window_seen) == 0 and float(metric.window_weights.sum()) == 0.0


def _ranks_body(rank: int, world_size: int) -> dict[str, object]:
    metric = SlidingWindow("auc", window=20)
    batches = _batches(3, 16, seed=10 + rank)
    for preds, labels in batches:
        metric.update(preds, labels)
    return {"auc": float(metric.compute()), "batches": batches, "seen": int(metric.window_seen)}


def test_the_windows_of_all_ranks_are_computed_together() -> None:
    results = run_ranks(_ranks_body, world_size=2)
    preds = torch.cat([torch.cat([p for p, _ in r["batches"]])[-20:] for r in results])  # each rank's newest 20
    labels = torch.cat([torch.cat([y for _, y in r["batches"]])[-20:] for r in results])
    assert results[0]["auc"] == results[1]["auc"] == pytest.approx(rank_auc(preds, labels), abs=1e-6)
    assert results[0]["seen"] == 48  # compute restores each rank's own state
