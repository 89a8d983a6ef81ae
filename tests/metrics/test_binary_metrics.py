"""AUC, NE, Calibration, CTR and Accuracy against hand-written numpy references (single process)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightrec.metrics import AUC, CTR, NE, Accuracy, Calibration, MetricInputError, binary_auc
from tests.metrics.references import (
    accuracy_formula,
    auc_pairs,
    calibration_formula,
    ctr_formula,
    ne_formula,
)


def make_data(n: int, seed: int, *, ties: bool, weighted: bool) -> tuple[torch.Tensor, ...]:
    """preds [n] in [0, 1] (on a 1/16 grid when ties), labels [n] 0/1 floats, weights [n] or None."""
    g = torch.Generator().manual_seed(seed)
    preds = torch.rand(n, generator=g)
    if ties:
        preds = torch.round(preds * 16) / 16  # many exact ties, including 0.0, 0.5 and 1.0
    labels = (torch.rand(n, generator=g) < 0.2 + 0.6 * preds).float()  # informative but noisy
    weights = None
    if weighted:
        weights = torch.rand(n, generator=g) * 2
        weights[::7] = 0.0  # zero-weight samples must not count at all
    return preds, labels, weights


def np_(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.double().numpy()


def reference(name: str, preds, labels, weights) -> float:
    p, y, w = np_(preds), np_(labels), np_(weights)
    return {
        "auc": lambda: auc_pairs(p, y, w),
        "ne": lambda: ne_formula(p, y, w),
        "calibration": lambda: calibration_formula(p, y, w),
        "ctr": lambda: ctr_formula(y, w),
        "accuracy": lambda: accuracy_formula(p, y, w),
    }[name]()


METRICS = {"auc": AUC, "ne": NE, "calibration": Calibration, "ctr": CTR, "accuracy": Accuracy}


@pytest.mark.parametrize("name", sorted(METRICS))
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_metric_matches_reference(name: str, ties: bool, weighted: bool) -> None:
    preds, labels, weights = make_data(
        600, seed=len(name) + 2 * ties + weighted, ties=ties, weighted=weighted
    )
    metric = METRICS[name]()
    metric.update(preds, labels, weights)
    got = metric.compute()
    assert got.dtype == torch.float32 and got.dim() == 0
    assert got.item() == pytest.approx(reference(name, preds, labels, weights), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("name", sorted(METRICS))
def test_several_batches_equal_one_batch_and_reset(name: str) -> None:
    preds, labels, weights = make_data(500, seed=11, ties=True, weighted=True)
    sizes = [1, 0, 120, 79, 300]  # includes an empty batch
    streamed = METRICS[name]()
    for p, y, w in zip(preds.split(sizes), labels.split(sizes), weights.split(sizes), strict=True):
        streamed.update(p, y, w)
    whole = METRICS[name]()
    whole.update(preds, labels, weights)
    assert streamed.compute().item() == pytest.approx(whole.compute().item(), rel=1e-6)

    # After reset the metric must forget everything: only the new batch counts.
    streamed.reset()
    p2, y2, w2 = make_data(200, seed=12, ties=False, weighted=False)
    streamed.update(p2, y2, w2)
    assert streamed.compute().item() == pytest.approx(reference(name, p2, y2, w2), rel=1e-6)


def test_two_column_inputs_are_flattened() -> None:
    preds, labels, weights = make_data(64, seed=3, ties=False, weighted=True)
    for cls in METRICS.values():
        flat, column = cls(), cls()
        flat.update(preds, labels, weights)
        column.update(preds[:, None], labels[:, None], weights[:, None])
        assert column.compute().item() == pytest.approx(flat.compute().item())


def test_labels_of_any_numeric_dtype() -> None:
    preds, labels, _ = make_data(100, seed=4, ties=False, weighted=False)
    as_float, as_int, as_bool = AUC(), AUC(), AUC()
    as_float.update(preds, labels)
    as_int.update(preds, labels.long())
    as_bool.update(preds, labels.bool())
    assert as_int.compute() == as_float.compute() == as_bool.compute()


def test_auc_perfect_reversed_and_constant_scores() -> None:
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert binary_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels).item() == 1.0
    assert binary_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels).item() == 0.0
    assert binary_auc(torch.full((4,), 0.3), labels).item() == 0.5


def test_auc_accepts_raw_scores_but_histogram_needs_probabilities() -> None:
    scores = torch.tensor([-3.0, 2.0, 7.5, -0.1])
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    exact = AUC()
    exact.update(scores, labels)
    assert exact.compute().item() == 1.0
    with pytest.raises(MetricInputError, match="probabilities in \\[0, 1\\]"):
        AUC(num_bins=100).update(scores, labels)


def test_histogram_auc_exact_on_bin_aligned_scores_and_close_otherwise() -> None:
    # Scores at bin centres: every tie in the histogram is a real tie, so the result is exact.
    preds, labels, weights = make_data(800, seed=5, ties=True, weighted=True)
    centres = (torch.floor(preds * 15.999) + 0.5) / 16
    hist = AUC(num_bins=16)
    hist.update(centres, labels, weights)
    assert hist.compute().item() == pytest.approx(
        auc_pairs(np_(centres), np_(labels), np_(weights)), rel=1e-6
    )

    # Continuous scores: the error is bounded by half the within-bin pairs (here tiny with 1000 bins).
    preds, labels, _ = make_data(2000, seed=6, ties=False, weighted=False)
    hist = AUC(num_bins=1000)
    hist.update(preds, labels)
    assert hist.compute().item() == pytest.approx(auc_pairs(np_(preds), np_(labels)), abs=2e-3)


def test_soft_labels_split_into_positive_and_negative_mass() -> None:
    # A label of 0.25 with weight 1 is the same as a positive of weight 0.25 plus a negative of weight 0.75.
    preds = torch.tensor([0.1, 0.4, 0.7, 0.9])
    soft = torch.tensor([0.25, 1.0, 0.0, 0.5])
    expanded_p = torch.cat([preds, preds])
    expanded_y = torch.cat([torch.ones(4), torch.zeros(4)])
    expanded_w = torch.cat([soft, 1 - soft])
    for cls in (AUC, NE, Calibration, CTR, Accuracy):
        a, b = cls(), cls()
        a.update(preds, soft)
        b.update(expanded_p, expanded_y, expanded_w)
        assert a.compute().item() == pytest.approx(b.compute().item(), rel=1e-6), cls.__name__


def test_ne_clamps_extreme_predictions_with_eps() -> None:
    preds = torch.tensor([0.0, 1.0, 0.3, 0.6])
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])  # two confidently wrong predictions
    for eps in (1e-12, 1e-3):
        ne = NE(eps=eps)
        ne.update(preds, labels)
        got = ne.compute().item()
        assert math.isfinite(got)
        assert got == pytest.approx(ne_formula(preds.numpy(), labels.numpy(), eps=eps), rel=1e-6)


def test_ne_of_constant_ctr_predictor_is_one() -> None:
    labels = (torch.arange(1000) % 4 == 0).float()  # CTR exactly 0.25
    ne = NE()
    ne.update(torch.full((1000,), 0.25), labels)
    assert ne.compute().item() == pytest.approx(1.0, rel=1e-6)


def test_accuracy_threshold_is_strict_like_torchmetrics() -> None:
    acc = Accuracy()
    acc.update(torch.tensor([0.5, 0.5, 0.51, 0.2]), torch.tensor([0.0, 1.0, 1.0, 1.0]))
    assert acc.compute().item() == pytest.approx(2 / 4)  # 0.5 is a negative prediction
    custom = Accuracy(threshold=0.1)
    custom.update(torch.tensor([0.2]), torch.tensor([1.0]))
    assert custom.compute().item() == 1.0
