"""What a ``RecModule`` whose tables train inside backward (fused optimizer) checks of its Trainer.

Given a data-parallel strategy that does not shard tables (``strategy="ddp"``, FSDP, ...) it is refused
at ``setup("fit")`` by name, not by torch's ``AttributeError`` about ``torch.distributed.optim`` in the
first forward. ``accumulate_grad_batches`` and ``gradient_clip_val``, which reach the dense part only,
are warned about once when the optimizers are configured, and so is an LR scheduler of the user's own
``configure_optimizers`` that does not reach the tables' fused optimizer.

Under such a strategy the DDP wrapper cannot run the tables' in-backward optimizer, and even if it
could, each replica's tables would step on its own rank's gradients. A model whose tables are plain
parameters (updated by the dense optimizer) trains under DDP like any dense model and is not refused.
"""

from __future__ import annotations

from typing import TypeVar

import lightning.pytorch as pl
from lightning.pytorch.strategies import ParallelStrategy, Strategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.optim import Optimizer

from lightrec.lightning.contracts import EmbeddingShardingStrategy

FusedOpt = TypeVar("FusedOpt", bound=Optimizer)

__all__ = [
    "FusedTablesStrategyError",
    "refuse_fused_tables_under_data_parallel",
    "unlisted_fused_optimizers",
    "warn_schedulers_that_miss_fused_tables",
    "warn_trainer_flags_with_fused_tables",
]


class FusedTablesStrategyError(ValueError):
    """A ``RecModule`` whose embedding tables train in backward (fused optimizer) was given to a data-parallel
    strategy other than ``RecStrategy``; the message names the strategy and the fix."""


def refuse_fused_tables_under_data_parallel(module: nn.Module, strategy: Strategy, builds_fused: bool) -> None:
    """Raise :class:`FusedTablesStrategyError` when ``strategy`` is data parallel without sharding tables and
    ``module`` has tables updated in backward: ``builds_fused`` (tables its ``configure_model`` will build,
    fused under any strategy but ``RecStrategy``) or parameters already marked for an in-backward optimizer
    (fused collections, ``apply_optimizer_in_backward``)."""
    if not isinstance(strategy, ParallelStrategy) or isinstance(strategy, EmbeddingShardingStrategy):
        return
    if not builds_fused and not any(hasattr(p, "_in_backward_optimizers") for p in module.parameters()):
        return
    raise FusedTablesStrategyError(
        f"{type(module).__name__} trains its embedding tables with a fused optimizer inside backward, which "
        f"the Trainer's strategy {type(strategy).__name__} (e.g. strategy='ddp', 'fsdp') cannot run: "
        "its data-parallel wrapper would fail at the first forward, and each replica's tables would step on "
        "its own rank's gradients. Pass strategy=lightrec.lightning.RecStrategy(...) (it shards the tables "
        "and works on any number of devices, 1 included), or train on one device with strategy='auto'"
    )


def warn_trainer_flags_with_fused_tables(trainer: pl.Trainer) -> None:
    """Warn (rank 0, once per fit) about the Trainer flags that reach the dense parameters only: the
    tables' fused optimizer updates their rows inside every batch's backward, before Lightning
    accumulates or clips."""
    accumulate = trainer.accumulate_grad_batches
    if accumulate > 1:
        rank_zero_warn(
            f"accumulate_grad_batches={accumulate}: the dense parameters step once per {accumulate} batches, but "
            "the embedding tables' fused optimizer updates their rows inside every batch's backward (with that "
            f"batch's gradient, scaled by 1/{accumulate} as Lightning scales the loss), as torchrec's fused "
            "optimizers do. To step the tables once per accumulated step, raise the batch size instead",
            category=UserWarning,
        )
    clip = trainer.gradient_clip_val
    if clip:
        given = trainer.gradient_clip_algorithm  # None: Lightning clips by norm
        algorithm = "norm" if given is None else str(given.value)
        rank_zero_warn(
            f"gradient_clip_val={clip} (gradient_clip_algorithm={algorithm!r}) clips the dense parameters' "
            "gradients only"
            + (", and their norm is taken over the dense parameters alone" if algorithm == "norm" else "")
            + ": the embedding tables' fused optimizer applies each batch's table gradients inside backward, "
            "before Lightning clips, so the table rows are updated unclipped. To limit the table updates, "
            "lower the embedding learning rate (RecModule(embedding_lr=...) or the strategy's fused_params)",
            category=UserWarning,
        )


def warn_schedulers_that_miss_fused_tables(
    trainer: pl.Trainer, fused_optimizers: list[tuple[str, Optimizer]]
) -> None:
    """Warn (rank 0, once per fit) when the trainer has LR schedulers but none of its optimizers holds a
    fused embedding optimizer's parameter groups: the schedule then never reaches those tables, which keep
    their initial learning rate (a ``configure_optimizers`` override that returns a dense optimizer only).

    A dense optimizer without any scheduler is not warned about: the tables then train at their own
    constant learning rate, as ``RecModule``'s default does with a constant schedule.
    """
    configs = list(trainer.lr_scheduler_configs)
    if not configs or not fused_optimizers:
        return
    missed = [path or "embeddings" for path, _ in unlisted_fused_optimizers(trainer.optimizers, fused_optimizers)]
    if not missed:
        return
    schedulers = sorted({type(config.scheduler).__name__ for config in configs})
    rank_zero_warn(
        f"configure_optimizers returned LR scheduler(s) {schedulers}, but none of its optimizers holds the fused "
        f"embedding optimizer(s) of {missed}, which update the tables inside backward: the schedule never reaches "
        "the tables, which keep their initial learning rate. To schedule them too, return "
        "lightrec.optim.CombinedOptimizer([*self.fused_optimizers(), ('dense', KeyedOptimizerWrapper("
        "self.dense_parameters(), lambda params: YourOptimizer(params, ...)))]) and build the scheduler on it "
        "(as RecModule.configure_optimizers does); to keep the tables' learning rate constant on purpose, list "
        "the fused optimizers among the returned optimizers without a scheduler",
        category=UserWarning,
    )


def unlisted_fused_optimizers(
    optimizers: list[Optimizer], fused_optimizers: list[tuple[str, FusedOpt]]
) -> list[tuple[str, FusedOpt]]:
    """The ``(path, fused optimizer)`` pairs whose parameter groups none of ``optimizers`` (the trainer's)
    holds: a ``configure_optimizers`` override that returns a dense optimizer only leaves them out, so
    Lightning neither saves nor restores their state (``RecModule`` carries it itself). Groups, not the
    optimizers, are compared: a fused collection builds a new ``CombinedOptimizer`` of the same groups on
    each ``fused_optimizer`` access."""
    held = {id(group) for optimizer in optimizers for group in optimizer.param_groups}
    return [(path, opt) for path, opt in fused_optimizers if any(id(g) not in held for g in opt.param_groups)]
