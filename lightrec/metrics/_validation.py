"""Input checks shared by the lightrec metrics.

Every binary metric takes the same three tensors::

    preds    [B] or [B, 1]  floating   predicted probability (AUC also accepts raw scores)
    labels   [B] or [B, 1]  float/int/bool, values in [0, 1] (0/1 clicks; soft labels allowed)
    weights  [B] or [B, 1]  floating, >= 0, optional (None means every sample weighs 1)

A trailing singleton dimension is dropped because model heads usually emit ``[B, 1]``; any other
shape is a :class:`MetricInputError`, never a silent broadcast.

The value checks (NaN, range, negative weights) need the data on the host, so on an accelerator
they cost one device sync per ``update``. They are folded into one reduction so the cost is one sync,
and ``validate_args=False`` on every metric turns them off for production loops.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import rank_zero_warn


class MetricInputError(ValueError):
    """A metric received tensors of the wrong shape, type or value range."""


def _as_vector(name: str, arg: str, value: Tensor) -> Tensor:
    """Flattens ``[B]`` or ``[B, 1]`` to ``[B]``; rejects anything else."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: `{arg}` must be a torch.Tensor, got {type(value).__name__}.")
    if value.dim() == 1:
        return value
    if value.dim() == 2 and value.shape[1] == 1:
        return value[:, 0]
    raise MetricInputError(
        f"{name}: `{arg}` must have shape [B] or [B, 1], got {list(value.shape)}. "
        "Flatten multi-task outputs and update one metric per task."
    )


def check_binary_inputs(
    name: str,
    preds: Tensor,
    labels: Tensor,
    weights: Tensor | None,
    *,
    preds_are_probabilities: bool,
    validate_args: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Validates and normalises the inputs of a binary metric's ``update``.

    Args:
        name: metric class name, used in error messages.
        preds: ``[B]`` or ``[B, 1]`` predictions.
        labels: ``[B]`` or ``[B, 1]`` labels in ``[0, 1]``.
        weights: ``[B]`` or ``[B, 1]`` non-negative sample weights, or None.
        preds_are_probabilities: also require ``0 <= preds <= 1``.
        validate_args: run the value checks (shapes and dtypes are always checked; they are free).

    Returns:
        ``(preds, labels, weights)``, each ``[B]`` in float64 on ``preds.device``; ``weights`` is all
        ones when None was given. float64 keeps sums over millions of samples exact enough.

    Raises:
        TypeError: an argument is not a tensor, or ``preds`` is not floating point.
        MetricInputError: shapes differ, or (with ``validate_args``) a value is out of range.
    """
    preds = _as_vector(name, "preds", preds)
    labels = _as_vector(name, "labels", labels)
    if not torch.is_floating_point(preds):
        raise TypeError(
            f"{name}: `preds` must be floating point (probabilities), got dtype {preds.dtype}. "
            "Pass model outputs after the sigmoid, e.g. `torch.sigmoid(logits)`."
        )
    if labels.shape != preds.shape:
        raise MetricInputError(
            f"{name}: `labels` has {labels.shape[0]} samples but `preds` has {preds.shape[0]}; "
            "pass one label per prediction."
        )
    if weights is not None:
        weights = _as_vector(name, "weights", weights)
        if weights.shape != preds.shape:
            raise MetricInputError(
                f"{name}: `weights` has {weights.shape[0]} samples but `preds` has {preds.shape[0]}; "
                "pass one weight per prediction or weights=None."
            )
    preds64 = preds.detach().to(torch.float64)
    labels64 = labels.detach().to(device=preds.device, dtype=torch.float64)
    weights64 = (
        torch.ones_like(preds64)
        if weights is None
        else weights.detach().to(device=preds.device, dtype=torch.float64)
    )
    if validate_args and preds64.numel() > 0:
        _check_values(
            name, preds64, labels64, weights64 if weights is not None else None, preds_are_probabilities
        )
    return preds64, labels64, weights64


def _check_values(
    name: str, preds: Tensor, labels: Tensor, weights: Tensor | None, preds_are_probabilities: bool
) -> None:
    # One stacked reduction -> one host sync, whatever the number of checks.
    bad_preds = torch.isnan(preds)
    if preds_are_probabilities:
        bad_preds = bad_preds | (preds < 0) | (preds > 1)
    bad_labels = torch.isnan(labels) | (labels < 0) | (labels > 1)
    bad_weights = None if weights is None else ~torch.isfinite(weights) | (weights < 0)
    checks = [bad_preds.any(), bad_labels.any()]
    if bad_weights is not None:
        checks.append(bad_weights.any())
    flags = torch.stack(checks).tolist()
    if flags[0]:
        first = preds[bad_preds][:5].tolist()
        what = "probabilities in [0, 1]" if preds_are_probabilities else "real numbers (no NaN)"
        hint = " Apply torch.sigmoid to logits first." if preds_are_probabilities else ""
        raise MetricInputError(f"{name}: `preds` must be {what}; got values such as {first}.{hint}")
    if flags[1]:
        first = labels[bad_labels][:5].tolist()
        raise MetricInputError(
            f"{name}: `labels` must lie in [0, 1] (0/1 clicks or soft labels); got values such as {first}."
        )
    if weights is not None and bad_weights is not None and flags[2]:
        first = weights[bad_weights][:5].tolist()
        raise MetricInputError(f"{name}: `weights` must be finite and >= 0; got values such as {first}.")


def nan_result(device: torch.device) -> Tensor:
    """The value every metric returns when it has nothing to divide by (documented in docs/metrics.md)."""
    return torch.tensor(float("nan"), dtype=torch.float32, device=device)


def undefined_result(metric: Metric, name: str, why: str) -> Tensor:
    """What ``metric`` returns when it has nothing to divide by: NaN, after a ``UserWarning`` naming ``why``.

    A metric whose ``undefined_value`` attribute is a float returns that instead, silently: torchrec's
    ``RecMetric`` keys report torchrec's defaults there (0, or 0.5 for AUC), so
    :class:`~lightrec.metrics.rec_metric.RecMetric` sets it on the metrics it builds.
    """
    value = getattr(metric, "undefined_value", None)
    if value is not None:
        return torch.tensor(float(value), dtype=torch.float32, device=metric.device)
    rank_zero_warn(f"{name} is undefined because {why}; returning NaN.", UserWarning)
    return nan_result(metric.device)
