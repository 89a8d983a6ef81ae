"""Recipe options that were accepted and then failed late or did nothing: each is refused up front, naming it."""

from __future__ import annotations

import pytest

from lightrec.metrics import DEFAULT_METRICS
from lightrec.recipes.dlrm import DLRMModule
from lightrec.recipes.two_tower import TwoTowerModule


@pytest.mark.parametrize("sizes", [[64, 2], [8], []])
def test_dlrm_recipe_refuses_over_arch_not_ending_in_one(sizes: list[int]) -> None:
    """[64, 2] built a model whose 2B logits met B labels in the first step's BCE (a traceback on every rank)."""
    with pytest.raises(ValueError, match=r"over_arch_layer_sizes must end in 1.*got \["):
        DLRMModule(over_arch_layer_sizes=sizes)


@pytest.mark.parametrize("sizes", [[1], [64, 32, 1]])
def test_dlrm_recipe_accepts_one_logit(sizes: list[int]) -> None:
    assert DLRMModule(over_arch_layer_sizes=sizes).over_arch_layer_sizes == sizes


@pytest.mark.parametrize("kwargs", [{"metrics": ["auc"]}, {"metrics": "ne"}, {"train_metrics": True}])
def test_two_tower_recipe_refuses_click_metrics_it_never_logs(kwargs: dict[str, object]) -> None:
    """--model.metrics / --model.train_metrics were accepted and ignored: the recipe logs recall@k only."""
    with pytest.raises(ValueError, match=r"two_tower recipe logs recall@k.*--model\.metrics"):
        TwoTowerModule(**kwargs)


def test_two_tower_recipe_takes_the_default_metrics_the_cli_passes() -> None:
    """LightningCLI hands every RecModule argument over, ``metrics`` with its default (as a list)."""
    TwoTowerModule(metrics=list(DEFAULT_METRICS), train_metrics=False)
    TwoTowerModule(metrics=DEFAULT_METRICS)


@pytest.mark.parametrize("metrics", [None, (), []])
def test_two_tower_recipe_takes_no_metrics(metrics: object) -> None:
    """``metrics=None`` / ``()`` mean no click metrics (RecModule's "none"): what the recipe does anyway
    (``None`` raised a bare TypeError from ``list(None)``)."""
    module = TwoTowerModule(metrics=metrics)
    assert len(module.val_metrics) == 0 and len(module.test_metrics) == 0


@pytest.mark.parametrize("k", [0, -3, True])
def test_two_tower_recipe_names_recall_k(k: int) -> None:
    with pytest.raises(ValueError, match=rf"recall_k must be an int >= 1.*got {k!r}"):
        TwoTowerModule(recall_k=k)
