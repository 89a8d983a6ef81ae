"""RecallAtK against a position-enumerating numpy reference."""

from __future__ import annotations

import pytest
import torch

from lightrec.metrics import MetricInputError, RecallAtK
from tests.metrics.references import recall_at_k_random_ties


def make_scores(b: int, c: int, seed: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, c, generator=g)
    if ties:
        scores = torch.round(scores * 2) / 2  # few distinct values: many ties with the target
    target = torch.randint(0, c, (b,), generator=g)
    return scores, target


@pytest.mark.parametrize("k", [1, 3, 10, 40])
@pytest.mark.parametrize("ties", [False, True])
def test_recall_matches_reference(k: int, ties: bool) -> None:
    scores, target = make_scores(200, 25, seed=k + ties, ties=ties)
    metric = RecallAtK(k=k)
    metric.update(scores, target)
    expected = recall_at_k_random_ties(scores.numpy(), target.numpy(), k)
    assert metric.compute().item() == pytest.approx(expected, rel=1e-6)


def test_without_ties_equals_topk_membership() -> None:
    scores, target = make_scores(300, 50, seed=1, ties=False)
    metric = RecallAtK(k=5)
    metric.update(scores, target)
    in_topk = (scores.topk(5, dim=1).indices == target[:, None]).any(dim=1).float().mean()
    assert metric.compute().item() == pytest.approx(in_topk.item())


def test_constant_scores_give_k_over_c_and_in_batch_identity_gives_one() -> None:
    metric = RecallAtK(k=2)
    metric.update(torch.zeros(4, 8), torch.tensor([0, 3, 5, 7]))
    assert metric.compute().item() == pytest.approx(2 / 8)
    in_batch = RecallAtK(k=1)
    in_batch.update(torch.eye(6) * 5, torch.arange(6))  # [B, B] in-batch scores, diagonal is the positive
    assert in_batch.compute().item() == 1.0


def test_batches_equal_one_batch_and_reset() -> None:
    scores, target = make_scores(120, 30, seed=2, ties=True)
    streamed, whole = RecallAtK(k=4), RecallAtK(k=4)
    for s, t in zip(scores.split([50, 0, 70]), target.split([50, 0, 70]), strict=True):
        streamed.update(s, t)
    whole.update(scores, target)
    assert streamed.compute().item() == pytest.approx(whole.compute().item())
    streamed.reset()
    streamed.update(scores[:10], target[:10])
    expected = recall_at_k_random_ties(scores[:10].numpy(), target[:10].numpy(), 4)
    assert streamed.compute().item() == pytest.approx(expected)


def test_bad_inputs_have_clear_errors() -> None:
    metric = RecallAtK(k=3)
    with pytest.raises(MetricInputError, match=r"`scores` must have shape \[B, C\]"):
        metric.update(torch.rand(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(MetricInputError, match=r"`target` must have shape \[B\] = \[4\]"):
        metric.update(torch.rand(4, 6), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer candidate indices"):
        metric.update(torch.rand(4, 6), torch.zeros(4))
    with pytest.raises(MetricInputError, match=r"indices in \[0, 6\).*\[6\]"):
        metric.update(torch.rand(4, 6), torch.tensor([0, 6, 1, 2]))
    with pytest.raises(MetricInputError, match="NaN"):
        metric.update(torch.full((2, 6), float("nan")), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="floating point"):
        metric.update(torch.ones(2, 6, dtype=torch.long), torch.tensor([0, 1]))
