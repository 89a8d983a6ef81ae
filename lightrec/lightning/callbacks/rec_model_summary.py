"""``RecModelSummary``: Lightning's model summary, with embedding tables counted as they are.

Lightning's ``ModelSummary`` counts the parameters of the module in the process that prints it,
and calls every parameter without ``requires_grad`` "Non-trainable". Both are wrong for a
model-parallel recommendation model:

* rank 0 holds only *its shards* of the embedding tables -- the summary of a 2-rank DLRM showed
  about half of the table rows;
* the tables are trained by the fused optimizer inside backward (their weights need no
  ``.grad``), so they are not "Non-trainable".

``RecModelSummary`` prints the same table, with each embedding collection that trains in backward
(a module with a ``fused_optimizer``) counted at its *whole* size -- ``num_embeddings x
embedding_dim`` of every table, from the collection's configs, so data-parallel replicas count
once -- and as trainable, plus one line saying how many parameters are embedding rows and over
how many ranks they are spread. Nothing is collective: each rank knows the full table configs.

``RecModule.configure_callbacks`` puts it in place of the Trainer's default ``ModelSummary``
(same ``max_depth``); ``enable_model_summary=False`` or a ``RichModelSummary`` is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_human_readable_count as human
from lightning.pytorch.utilities.model_summary import summarize
from torch import nn
from typing_extensions import override

from lightrec.distributed.planner.plan.sharder import tables_of
from lightrec.lightning.contracts import FusedOptimizerModule

__all__ = ["EmbeddingCount", "RecModelSummary", "count_embedding_parameters", "summary_for"]


@dataclass(frozen=True)
class EmbeddingCount:
    """Embedding parameters of a module: ``whole`` (all tables, all ranks) and ``local`` (this process).

    ``per_owner`` maps each counted collection's module path to its ``whole - local`` difference
    (what the summary adds to the rows of that module and of its parents).
    """

    whole: int
    local: int
    local_trainable: int
    per_owner: dict[str, int]

    def extra_for(self, path: str) -> int:
        """Parameters to add to the summary row of module ``path`` (``""``: the whole model)."""
        return sum(
            d
            for owner, d in self.per_owner.items()
            if not path or owner == path or owner.startswith(path + ".")
        )


def _whole_table_parameters(collection: nn.Module, local: int) -> int:
    configs = tables_of(collection)
    if configs is not None:
        return sum(int(c.num_embeddings) * int(c.embedding_dim) for c in configs)
    return local  # an unsharded (fused) collection holds its whole tables


def _trains_in_backward(module: nn.Module) -> bool:
    return isinstance(module, FusedOptimizerModule) and module.fused_optimizer is not None


def count_embedding_parameters(module: nn.Module) -> EmbeddingCount:
    """Count the parameters of the outermost collections of ``module`` that train in backward."""
    owners: list[str] = []
    whole = local = local_trainable = 0
    per_owner: dict[str, int] = {}
    for name, child in module.named_modules():
        if (
            any(name.startswith(owner + ".") for owner in owners)
            or not _trains_in_backward(child)
        ):
            continue
        owners.append(name)
        params = list(child.parameters())
        here = sum(p.numel() for p in params)
        total = _whole_table_parameters(child, here)
        whole, local = whole + total, local + here
        local_trainable += sum(p.numel() for p in params if p.requires_grad)
        per_owner[name] = total - here
    return EmbeddingCount(whole, local, local_trainable, per_owner)


class RecModelSummary(ModelSummary):
    """Lightning's ``ModelSummary`` with sharded, fused-trained embedding tables counted truthfully.

    Args:
        max_depth: as ``ModelSummary``'s (``1``: the direct children of the LightningModule).
        **summarize_kwargs: as ``ModelSummary``'s.
    """

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        depth = int(getattr(self, "_max_depth", 1))
        if not depth or not trainer.is_global_zero:
            return
        summary = summarize(pl_module, max_depth=depth)
        counted = count_embedding_parameters(pl_module)
        extra = counted.whole - counted.local
        rows = [
            n + counted.extra_for(name)
            for name, n in zip(summary.layer_names, summary.param_nums, strict=True)
        ]
        columns = [
            (title, [human(n) for n in rows] + values[len(rows) :] if title == "Params" else values)
            for title, values in summary._get_summary_data()  # Lightning's columns, our counts
        ]
        total = summary.total_parameters + extra
        trainable = summary.trainable_parameters - counted.local_trainable + counted.whole
        size_mb = summary.model_size * total / max(summary.total_parameters, 1)
        self.summarize(
            columns,
            total,
            trainable,
            size_mb,
            summary.total_training_modes,
            total_flops=getattr(summary, "total_flops", 0),
            **getattr(self, "_summarize_kwargs", {}),
        )
        if counted.whole:
            rank_zero_info(
                f"{human(counted.whole)} of the trainable params are embedding-table rows, trained in backward by "
                f"the fused embedding optimizer, spread over {trainer.world_size} rank(s) "
                f"({human(counted.local)} held by rank 0)"
            )


def summary_for(trainer: Any) -> RecModelSummary | None:
    """Take the Trainer's default ``ModelSummary`` out of its callbacks and return a ``RecModelSummary``
    with its ``max_depth`` to put in its place (None, and nothing changed, for any other set-up).

    Taken out here rather than overridden through ``configure_callbacks``, which would print a
    line about the override on every run.
    """
    if trainer is None:
        return None
    summaries = [cb for cb in trainer.callbacks if isinstance(cb, ModelSummary)]
    if len(summaries) != 1 or type(summaries[0]) is not ModelSummary:
        return None  # none (enable_model_summary=False), RichModelSummary, ours, or several: the user chose
    trainer.callbacks.remove(summaries[0])
    return RecModelSummary(max_depth=int(getattr(summaries[0], "_max_depth", 1)))
