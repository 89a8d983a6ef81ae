"""``_rewrite_model`` on models tracing cannot pipeline: a sharded module called twice is left
alone (its own forward, nothing replaced) and a model branching on the batch's values is not
rewritten at all; either trains exactly as the unrewritten model does (a plain-PyTorch reference).

One process: the sharded module is a torchrec-style ``ShardedModule`` extension whose stages are
``NoWait`` awaitables (``tests/distributed/test_train_pipeline_context.py``)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from lightrec import KeyedJaggedTensor
from lightrec.distributed.train_pipeline import _rewrite_model, _start_data_dist
from lightrec.distributed.train_pipeline.utils import (
    ShardedModule,
    TrainPipelineContext,
    _pipeline_detach_model,
)
from tests.distributed.test_train_pipeline_context import _Batch, _ShardedScale

ShardedModule.register(_ShardedScale)  # what deriving from ShardedModule does


class _CalledTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = _ShardedScale()

    def forward(self, batch: _Batch) -> torch.Tensor:
        ids = batch.kjts["ids"]
        return self.sparse(ids).wait().sum() + 2 * self.sparse(ids).wait().mean()


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = _ShardedScale()

    def forward(self, batch: _Batch) -> torch.Tensor:
        if batch.dense.sum() > 0:  # control flow on the batch: fx cannot trace it
            return self.sparse(batch.kjts["ids"]).wait().sum()
        return batch.dense.sum()


def _batches() -> list[_Batch]:
    g = torch.Generator().manual_seed(0)
    out = []
    for sign in (1.0, -1.0, 1.0):
        kjt = KeyedJaggedTensor(keys=["f"], values=torch.randint(0, 9, (3,), generator=g), lengths=torch.tensor([2, 1]))
        out.append(_Batch({"ids": kjt}, sign * torch.ones(2, 2)))
    return out


def _reference(model: nn.Module, batch: _Batch) -> torch.Tensor:
    """The model's loss with its sharded module computed in plain PyTorch (values * weight)."""
    scaled = batch.kjts["ids"].values().float() * model.sparse.weight
    if isinstance(model, _CalledTwice):
        return scaled.sum() + 2 * scaled.mean()
    return scaled.sum() if batch.dense.sum() > 0 else batch.dense.sum()


@pytest.mark.parametrize("model_cls", [_CalledTwice, _Branches], ids=["called_twice", "branches_on_the_batch"])
def test_untraceable_use_of_a_sharded_module_is_not_pipelined(model_cls: type, caplog: pytest.LogCaptureFixture) -> None:
    model, reference = model_cls(), model_cls()
    batches = _batches()
    context = TrainPipelineContext(version=1, index=0)
    with caplog.at_level(logging.WARNING):
        modules, same, originals, _, skipped = _rewrite_model(model, context, dist_stream=None, batch=batches[0])
    assert modules == [] and originals == [] and same is model and skipped == ["sparse"]
    assert "forward" not in vars(model.sparse)  # its own forward, nothing to detach
    assert "not pipelined" in caplog.text or "no sharded module is pipelined" in caplog.text
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for batch in batches:  # a custom loop as torchrec users write it: start, then forward
        _start_data_dist(modules, batch, context)
        opt.zero_grad()
        ref_opt.zero_grad()
        loss, want = model(batch), _reference(reference, batch)
        torch.testing.assert_close(loss, want, rtol=0, atol=0)
        if loss.requires_grad:
            loss.backward()
            want.backward()
        opt.step()
        ref_opt.step()
    _pipeline_detach_model(modules, originals)
    assert torch.equal(model.sparse.weight, reference.sparse.weight)
