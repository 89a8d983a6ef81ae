"""Which optimizer a fused embedding lookup applies inside backward, and with what settings.

Three spellings reach the same :class:`FusedOptimizerSpec`:

* a spec built directly: ``FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.02)``;
* torchrec-style ``fused_params``: ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
  "learning_rate": 0.02, "eps": 0.002}`` (fbgemm's own ``EmbOptimType`` members are accepted by
  name, so code written for torchrec keeps working);
* a torch optimizer class with its kwargs, as ``apply_optimizer_in_backward`` records them:
  ``(torch.optim.Adagrad, {"lr": 0.1})``.

Update rules (``g`` is the gradient of one row summed over every occurrence of its id in the batch;
only rows whose id occurs in the batch are touched, like fbgemm's "exact" optimizers):

=================  ==============================================================================
SGD                ``w -= lr * g``
ADAGRAD            ``s += g*g; w -= lr * g / (sqrt(s) + eps)``  (state ``[rows, D]``)
ROWWISE_ADAGRAD    ``m += mean(g*g); w -= lr * g / (sqrt(m) + eps)``  (state ``[rows]``)
ADAM               ``m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g*g;``
                   ``w -= lr * (m1/(1-b1^t)) / (sqrt(m2/(1-b2^t)) + eps)``; ``t`` counts backward
                   passes of the module (not per row), as in fbgemm (see "Step count" below)
LAMB, LARS_SGD,    fbgemm's rules, written once in :mod:`lightrec.optim.row_rules` (per-row trust
PARTIAL_ROWWISE_*  ratios; ``momentum2`` of the partial row-wise ones is ``[rows]``); their
                   ``weight_decay`` enters their own formula, ``weight_decay_mode`` is not used
=================  ==============================================================================

Step count ``t`` (Adam, LAMB, partial row-wise): one counter per lookup module (every table of it),
advanced once by every training step whose backward reaches the module -- also a step that looks
up no id of a table, and one whose batch has no samples. That is fbgemm's TBE ``iter`` (global to
the module, advanced on every training lookup) and also what ``torch.optim.Adam`` and
``torch.optim.SparseAdam`` do for the table's parameter: they advance ``state["step"]`` whenever
the parameter has a gradient, and a batch without ids still gives one (zeros, or an empty sparse
tensor). Only the rows a batch looks up, and their moments, change; dense Adam would also move
every row by its decaying moments.

Weight decay: ``"l2"`` adds ``weight_decay * w`` to ``g`` first (torch's ``weight_decay``);
``"decoupled"`` multiplies the row by ``1 - lr * weight_decay`` (AdamW, fbgemm's ``DECOUPLE``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from lightrec._enum import ValueEnum
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.optim.rowwise_optimizers import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB

__all__ = ["EmbOptimType", "FusedOptimizerSpec", "WeightDecayMode", "optimizer_class_to_spec"]


class EmbOptimType(ValueEnum):
    """Fused embedding optimizers. ``EXACT_*`` names are aliases kept for torchrec/fbgemm users."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "row_wise_adagrad"
    ADAM = "adam"
    LAMB = "lamb"
    LARS_SGD = "lars_sgd"
    PARTIAL_ROWWISE_ADAM = "partial_row_wise_adam"
    PARTIAL_ROWWISE_LAMB = "partial_row_wise_lamb"
    # Aliases (same member): fbgemm's deterministic "exact" variants are the only ones lightrec has.
    EXACT_SGD = "sgd"
    EXACT_ADAGRAD = "adagrad"
    EXACT_ROWWISE_ADAGRAD = "row_wise_adagrad"

    @classmethod
    def coerce(cls, value: object) -> EmbOptimType:
        """Accept our enum, fbgemm's ``EmbOptimType`` (by member name), or a name/value string."""
        if isinstance(value, cls):
            return value
        names = {m.lower(): member for m, member in cls.__members__.items()}
        names.update({member.value: member for member in cls})
        names["rowwise_adagrad"] = cls.ROWWISE_ADAGRAD
        names["exact_row_wise_adagrad"] = cls.ROWWISE_ADAGRAD
        names["exact_sgd"] = cls.SGD
        names["exact_adagrad"] = cls.ADAGRAD
        key = value.name if isinstance(value, Enum) else value
        if isinstance(key, str) and key.lower() in names:
            return names[key.lower()]
        raise ValueError(
            f"optimizer={value!r} is not a fused embedding optimizer lightrec supports; use one of "
            f"{[m.name for m in (cls.SGD, cls.ADAGRAD, cls.ROWWISE_ADAGRAD, cls.ADAM, *ROW_RULE_OPTIMIZERS)]} "
            "(or EXACT_SGD / EXACT_ADAGRAD / EXACT_ROWWISE_ADAGRAD)"
        )


ROW_RULE_OPTIMIZERS: tuple[EmbOptimType, ...] = (
    EmbOptimType.LAMB,
    EmbOptimType.LARS_SGD,
    EmbOptimType.PARTIAL_ROWWISE_ADAM,
    EmbOptimType.PARTIAL_ROWWISE_LAMB,
)
"""Optimizers whose update is a :mod:`lightrec.optim.row_rules` function (weight decay built in)."""

_ROW_STATES: dict[EmbOptimType, frozenset[str]] = {
    EmbOptimType.ROWWISE_ADAGRAD: frozenset({"momentum1"}),
    EmbOptimType.PARTIAL_ROWWISE_ADAM: frozenset({"momentum2"}),
    EmbOptimType.PARTIAL_ROWWISE_LAMB: frozenset({"momentum2"}),
}
_STEPPED = frozenset({EmbOptimType.ADAM, EmbOptimType.LAMB, EmbOptimType.PARTIAL_ROWWISE_ADAM,
                      EmbOptimType.PARTIAL_ROWWISE_LAMB})  # fmt: skip


class WeightDecayMode(Enum):
    """How ``weight_decay`` enters the update (see the module docstring)."""

    NONE = "none"
    L2 = "l2"
    DECOUPLED = "decoupled"
    DECOUPLE = "decoupled"  # fbgemm's spelling

    @classmethod
    def coerce(cls, value: object) -> WeightDecayMode:
        if isinstance(value, cls):
            return value
        key = value.name if isinstance(value, Enum) else value
        if isinstance(key, str):
            for name, member in cls.__members__.items():
                if key.lower() in (name.lower(), member.value):
                    return member
        raise ValueError(f"weight_decay_mode={value!r} is not one of 'none', 'l2', 'decoupled'")


# fused_params keys that tune storage and caching, not the optimizer: fbgemm's, and the tiered
# tables' (read by the sharders, lightrec.distributed.sharding.tiering); FP32 results do not change.
# torchrec's sharders copy a table's ParameterConstraints ``bounds_check_mode`` and ``enforce_hbm``
# into its fused_params: lightrec's kernels always refuse an id out of range (the collection's
# ``bounds_check`` policy decides when), and placement is the plan's.
_IGNORED_FUSED_PARAMS = frozenset(
    {
        "bounds_check_mode",
        "enforce_hbm",
        "stochastic_rounding",
        "cache_load_factor",
        "cache_precision",
        "prefetch_pipeline",
        "output_dtype",
        "cache_algorithm",
        "ssd_storage_directory",
        "cache_min_rows",
    }
)


@dataclass
class FusedOptimizerSpec:
    """Settings of one fused embedding optimizer.

    Args:
        optimizer: which update rule (``EmbOptimType`` or anything ``EmbOptimType.coerce`` accepts).
        learning_rate: initial learning rate; at run time the fused optimizer's
            ``param_groups[0]["lr"]`` is authoritative (schedulers change it there).
        eps: denominator guard of Adagrad / row-wise Adagrad / Adam (fbgemm's default 1e-8).
        weight_decay: decay factor, applied to touched rows only.
        weight_decay_mode: ``"l2"`` (default) or ``"decoupled"``; ignored when weight_decay is 0.
        beta1, beta2: moment decay rates of Adam, LAMB and the partial row-wise optimizers.
        eta: LARS_SGD's trust coefficient.
        momentum: LARS_SGD's momentum.
    """

    optimizer: EmbOptimType = EmbOptimType.SGD
    learning_rate: float = 0.01
    eps: float = 1.0e-8
    weight_decay: float = 0.0
    weight_decay_mode: WeightDecayMode = WeightDecayMode.L2
    beta1: float = 0.9
    beta2: float = 0.999
    eta: float = 0.001
    momentum: float = 0.9

    def __post_init__(self) -> None:
        self.optimizer = EmbOptimType.coerce(self.optimizer)
        self.weight_decay_mode = WeightDecayMode.coerce(self.weight_decay_mode)
        for name in ("learning_rate", "eps", "weight_decay", "eta", "momentum"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
            setattr(self, name, float(value))
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
            setattr(self, name, float(value))
        if self.optimizer in ROW_RULE_OPTIMIZERS:
            self.weight_decay_mode = WeightDecayMode.NONE  # their rule applies weight_decay itself
        elif self.weight_decay == 0.0:
            self.weight_decay_mode = WeightDecayMode.NONE
        elif self.weight_decay_mode == WeightDecayMode.NONE:
            self.weight_decay = 0.0

    @property
    def state_names(self) -> tuple[str, ...]:
        """Names of the per-table optimizer state tensors (``momentum1`` is ``[rows]`` for row-wise)."""
        return {
            EmbOptimType.SGD: (),
            EmbOptimType.ADAGRAD: ("momentum1",),
            EmbOptimType.ROWWISE_ADAGRAD: ("momentum1",),
            EmbOptimType.ADAM: ("momentum1", "momentum2"),
            EmbOptimType.LAMB: ("momentum1", "momentum2"),
            EmbOptimType.LARS_SGD: ("momentum1",),
            EmbOptimType.PARTIAL_ROWWISE_ADAM: ("momentum1", "momentum2"),
            EmbOptimType.PARTIAL_ROWWISE_LAMB: ("momentum1", "momentum2"),
        }[self.optimizer]

    def state_shape(self, name: str, rows: int, dim: int) -> tuple[int, ...]:
        """Shape of state ``name`` of a ``[rows, dim]`` table: ``(rows,)`` for one value per row."""
        return (rows,) if name in _ROW_STATES.get(self.optimizer, frozenset()) else (rows, dim)

    @property
    def uses_step(self) -> bool:
        """Whether the rule reads the step count ``t`` (bias corrections): the table's states then
        include the shared ``"step"`` counter."""
        return self.optimizer in _STEPPED

    @classmethod
    def from_fused_params(cls, fused_params: Mapping[str, Any]) -> FusedOptimizerSpec:
        """Build from a torchrec-style ``fused_params`` dict (``"optimizer"`` is required)."""
        if not isinstance(fused_params, Mapping):
            raise TypeError(f"fused_params must be a dict, got {type(fused_params).__name__}")
        if "optimizer" not in fused_params:
            raise KeyError(
                f"fused_params needs an 'optimizer' entry (e.g. EmbOptimType.EXACT_ROWWISE_ADAGRAD), "
                f"got keys {sorted(fused_params)}"
            )
        kwargs: dict[str, Any] = {}
        for key, value in fused_params.items():
            if key in _IGNORED_FUSED_PARAMS:
                continue
            if key == "lr":
                key = "learning_rate"
            lars = EmbOptimType.coerce(fused_params["optimizer"]) == EmbOptimType.LARS_SGD
            if (key in ("eta", "momentum") and not lars) or key not in {f.name for f in dataclasses.fields(cls)}:
                raise KeyError(
                    f"fused_params key {key!r} is not supported; supported keys are "
                    f"{sorted(f.name for f in dataclasses.fields(cls))} (and lr; eta and momentum belong to LARS_SGD)"
                )
            kwargs[key] = value
        return cls(**kwargs)

    def to_fused_params(self) -> dict[str, Any]:
        """The torchrec-style dict form (round-trips through :meth:`from_fused_params`)."""
        out = dataclasses.asdict(self)
        out["optimizer"] = self.optimizer
        out["weight_decay_mode"] = self.weight_decay_mode
        if self.optimizer != EmbOptimType.LARS_SGD:
            del out["eta"], out["momentum"]
        return out

    @classmethod
    def coerce(cls, value: FusedOptimizerSpec | Mapping[str, Any] | None) -> FusedOptimizerSpec | None:
        """Accept a spec, a ``fused_params`` dict, or None (no fused optimizer)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls.from_fused_params(value)
        raise TypeError(
            f"optimizer must be a FusedOptimizerSpec, a fused_params dict or None, got {type(value).__name__}"
        )


def optimizer_class_to_spec(optimizer_class: type, optimizer_kwargs: Mapping[str, Any]) -> FusedOptimizerSpec:
    """Translate ``(torch.optim.X, kwargs)`` into the fused optimizer that computes the same update.

    ``torch.optim.SGD`` (no momentum), ``Adagrad`` (no lr_decay / initial accumulator),
    ``lightrec.optim.RowWiseAdagrad``, ``Adam`` (L2 weight decay), ``AdamW`` (decoupled) and
    lightrec's (torchrec's) ``LAMB``, ``PartialRowWiseLAMB``, ``PartialRowWiseAdam``, ``LarsSGD`` map
    over; anything else raises ``ValueError`` saying what is supported.
    """
    if not isinstance(optimizer_class, type):
        raise TypeError(
            f"optimizer_class must be an optimizer class such as torch.optim.Adam, got "
            f"{type(optimizer_class).__name__} {' '.join(repr(optimizer_class).split())[:80]}; pass a "
            "FusedOptimizerSpec or a fused_params dict as fused_params=... instead"
        )
    kw = dict(optimizer_kwargs)
    lr = kw.pop("lr", None)

    def reject_nonzero(*names: str) -> None:
        for name in names:
            if kw.pop(name, 0) not in (0, 0.0, False, None):
                raise ValueError(
                    f"{optimizer_class.__name__}({name}={optimizer_kwargs[name]!r}) has no fused "
                    f"equivalent; drop {name} or keep this parameter out of the fused collection"
                )

    def finish(kind: EmbOptimType, default_lr: float, **extra: Any) -> FusedOptimizerSpec:
        reject_nonzero("maximize")
        for harmless in ("foreach", "differentiable", "fused", "capturable"):
            kw.pop(harmless, None)
        if kw:
            raise ValueError(
                f"{optimizer_class.__name__} kwargs {sorted(kw)} have no fused equivalent; "
                f"supported: lr, eps, weight_decay{', betas' if kind != EmbOptimType.SGD else ''}"
            )
        return FusedOptimizerSpec(kind, learning_rate=default_lr if lr is None else lr, **extra)

    for cls, kind in ((PartialRowWiseAdam, EmbOptimType.PARTIAL_ROWWISE_ADAM),
                      (PartialRowWiseLAMB, EmbOptimType.PARTIAL_ROWWISE_LAMB), (LAMB, EmbOptimType.LAMB)):  # fmt: skip
        if issubclass(optimizer_class, cls):
            beta1, beta2 = kw.pop("betas", (kw.pop("beta1", 0.9), kw.pop("beta2", 0.999)))
            return finish(kind, 1e-2, eps=kw.pop("eps", 1e-8), weight_decay=kw.pop("weight_decay", 0.0),
                          beta1=beta1, beta2=beta2)  # fmt: skip
    if issubclass(optimizer_class, LarsSGD):
        return finish(EmbOptimType.LARS_SGD, 1e-2, eta=kw.pop("eta", 1e-3), momentum=kw.pop("momentum", 0.9),
                      weight_decay=kw.pop("weight_decay", 0.0))  # fmt: skip
    if issubclass(optimizer_class, RowWiseAdagrad):
        reject_nonzero("lr_decay", "initial_accumulator_value")
        return finish(
            EmbOptimType.ROWWISE_ADAGRAD,
            0.01,
            eps=kw.pop("eps", 1e-10),
            weight_decay=kw.pop("weight_decay", 0.0),
        )
    if issubclass(optimizer_class, torch.optim.SGD):
        reject_nonzero("momentum", "dampening", "nesterov")
        return finish(EmbOptimType.SGD, 1e-3, weight_decay=kw.pop("weight_decay", 0.0))
    if issubclass(optimizer_class, torch.optim.Adagrad):
        reject_nonzero("lr_decay", "initial_accumulator_value")
        return finish(
            EmbOptimType.ADAGRAD, 0.01, eps=kw.pop("eps", 1e-10), weight_decay=kw.pop("weight_decay", 0.0)
        )
    if issubclass(optimizer_class, torch.optim.Adam):  # AdamW subclasses Adam in torch >= 2.6
        decoupled = issubclass(optimizer_class, torch.optim.AdamW)
        reject_nonzero("amsgrad")
        beta1, beta2 = kw.pop("betas", (0.9, 0.999))
        return finish(
            EmbOptimType.ADAM,
            1e-3,
            eps=kw.pop("eps", 1e-8),
            weight_decay=kw.pop("weight_decay", 1e-2 if decoupled else 0.0),
            weight_decay_mode=WeightDecayMode.DECOUPLED if decoupled else WeightDecayMode.L2,
            beta1=beta1,
            beta2=beta2,
        )
    raise ValueError(
        f"optimizer class {optimizer_class.__module__}.{optimizer_class.__name__} cannot be fused into "
        "embedding backward; use torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam, torch.optim.AdamW, "
        "lightrec.optim.RowWiseAdagrad, LAMB, PartialRowWiseLAMB, PartialRowWiseAdam or LarsSGD"
    )
