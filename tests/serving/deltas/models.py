"""Small trained models for the delta-application tests: a DLRM, a sequence model, a managed-collision
DLRM; their batches; training that changes some rows; the rows that changed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lightrec import KeyedJaggedTensor
from lightrec.distributed.deltas import table_rows
from tests.inference.helpers import dlrm, kjt, sequence_model
from tests.inference.test_mc_serving import _batch, trained_dlrm

Batch = tuple[torch.Tensor, KeyedJaggedTensor]


def build(kind: str) -> tuple[nn.Module, Callable[[int], Batch]]:
    """The model and a batch maker (``seed -> (dense, kjt)``) of ``kind``: dlrm | seq | mc."""
    if kind == "dlrm":
        return dlrm(), lambda s: (torch.randn(6, 5, generator=torch.Generator().manual_seed(s)), kjt(6, s))
    if kind == "seq":
        return sequence_model(), lambda s: (torch.zeros(6, 0), kjt(6, s))
    return trained_dlrm(), lambda s: (torch.randn(6, 3, generator=torch.Generator().manual_seed(s)), _batch(6, 100 + s))


def forward(model: nn.Module, batch: Batch, takes_dense: bool = True) -> torch.Tensor:
    return model(*batch) if takes_dense else model(batch[1])


def train(model: nn.Module, batches: list[Batch], takes_dense: bool = True) -> None:
    """A few SGD steps (managed-collision tables also insert and evict ids)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for batch in batches:
        opt.zero_grad()
        forward(model, batch, takes_dense).sum().backward()
        opt.step()
    model.eval()


def changed_rows(before: dict, model: nn.Module) -> dict[str, torch.Tensor]:
    """``{table: ids}`` of the rows whose values or raw ids differ from ``before`` (``table_rows``)."""
    out = {}
    for name, rows in table_rows(model).items():
        diff = (rows.values != before[name].values).any(dim=1)
        if rows.raw_ids is not None:
            diff |= rows.raw_ids != before[name].raw_ids
        out[name] = rows.ids[diff]
    return out


def cat_batches(batches: list[Batch]) -> Batch:
    """One batch holding the samples of ``batches`` (every id they had)."""
    keys = batches[0][1].keys()
    dense = torch.cat([b[0] for b in batches])
    per_key = [[b[1][k] for b in batches] for k in keys]
    values = torch.cat([jt.values() for jts in per_key for jt in jts])
    lengths = torch.cat([jt.lengths() for jts in per_key for jt in jts])
    return dense, KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
