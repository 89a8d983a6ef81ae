"""Train pipelines over several epochs (a new iterator after ``StopIteration``), dataloaders
shorter than the pipeline, a smaller last batch, and ``attach`` of a new model: every batch trained
once, parameters equal to a plain loop (forward, backward, ``optimizer.step`` per batch).

In one process on a dense model, and on 2 gloo ranks on a DLRM sharded by ``DistributedModelParallel``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from lightrec.datasets.random import RandomRecDataset
from lightrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from tests.distributed.test_train_pipeline import KEYS, _dlrm_dmp, _plain
from tests.multiprocess import run_ranks

PIPELINES = [TrainPipelineBase, TrainPipelineSparseDist]


class _Batch:
    """A custom batch class: ``.to(device, non_blocking)``, ``record_stream`` and ``pin_memory``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def to(self, device: torch.device, non_blocking: bool = False) -> _Batch:
        return _Batch(self.x.to(device, non_blocking=non_blocking), self.y.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.x.record_stream(stream)
        self.y.record_stream(stream)

    def pin_memory(self) -> _Batch:
        return _Batch(self.x.pin_memory(), self.y.pin_memory())


class _Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 1)

    def forward(self, batch: _Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.lin(batch.x).squeeze(1)
        loss = nn.functional.mse_loss(logits, batch.y)
        return loss, (loss.detach(), logits.detach(), batch.y)  # DLRMTrain's output layout


def _epoch(n: int, seed: int, last_size: int = 4) -> list[_Batch]:
    g = torch.Generator().manual_seed(seed)
    sizes = [4] * (n - 1) + [last_size] if n else []
    return [_Batch(torch.randn(k, 3, generator=g), torch.randn(k, generator=g)) for k in sizes]


def _plain_dense(batches: list[_Batch]) -> tuple[nn.Module, list[float]]:
    """The reference: a fresh model trained by the plain loop (forward, backward, step per batch)."""
    model = _Dense()
    return model, _plain(model, torch.optim.SGD(model.parameters(), lr=0.1), batches)


def _drain(pipeline: TrainPipelineBase | TrainPipelineSparseDist, it: Iterator) -> list[torch.Tensor]:
    out = []
    while True:
        try:
            out.append(pipeline.progress(it)[0])
        except StopIteration:
            break
    with pytest.raises(StopIteration):  # and again on the same, exhausted iterator
        pipeline.progress(it)
    return out


EPOCHS = {
    "two_epochs": [_epoch(3, 1), _epoch(4, 2)],
    "one_batch_epochs": [_epoch(1, 1), _epoch(1, 2), _epoch(2, 3)],
    "empty_then_two": [[], _epoch(2, 1)],
    "smaller_last_batch_each_epoch": [_epoch(3, 1, last_size=3), _epoch(2, 2, last_size=1)],
}


@pytest.mark.parametrize("epochs", list(EPOCHS.values()), ids=list(EPOCHS))
@pytest.mark.parametrize("pipeline_cls", PIPELINES, ids=lambda c: c.__name__)
def test_every_epoch_is_trained_like_the_plain_loop(pipeline_cls: type, epochs: list[list[_Batch]]) -> None:
    want_model, want_losses = _plain_dense([b for e in epochs for b in e])
    model = _Dense()
    pipeline = pipeline_cls(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    losses = [loss for epoch in epochs for loss in _drain(pipeline, iter(epoch))]
    assert len(losses) == len(want_losses)
    for got, want in zip(losses, want_losses, strict=True):
        assert float(got) == want  # a float32 loss converts to a Python float exactly
    for got, want in zip(model.parameters(), want_model.parameters(), strict=True):
        assert torch.equal(got, want)


def test_attach_of_a_model_keeps_the_custom_model_fwd() -> None:
    batches = _epoch(4, 5)
    want_model, _ = _plain_dense(batches)
    model = _Dense()
    seen: list[int] = []

    def fwd(batch: _Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        seen.append(len(batch.y))
        return model(batch)

    pipeline = TrainPipelineSparseDist(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                                       custom_model_fwd=fwd)  # fmt: skip
    it = iter(batches)
    pipeline.progress(it)
    pipeline.attach(pipeline.detach())
    _drain(pipeline, it)
    assert len(seen) == len(batches)  # every step went through the custom forward
    for got, want in zip(model.parameters(), want_model.parameters(), strict=True):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------- 2 gloo ranks
def _batches(rank: int, n: int, batch_size: int = 8, seed: int = 0) -> list:
    return list(RandomRecDataset(keys=KEYS, batch_size=batch_size, hash_size=40, ids_per_features=[1, 2, 3],
                                 num_dense=4, manual_seed=rank * 100 + seed, num_batches=n,
                                 num_generated_batches=-1))  # fmt: skip


def _sharded_body(rank: int, world_size: int) -> dict:
    from lightrec.distributed import gather_full_state_dict

    epochs = [_batches(rank, 2), _batches(rank, 1, seed=1), _batches(rank, 2, seed=2) + _batches(rank, 1, 3, seed=3)]
    model, opt = _dlrm_dmp(world_size)
    out: dict = {"plain": _plain(model, opt, [b for e in epochs for b in e])}
    out["plain_tables"] = gather_full_state_dict(model.state_dict())
    for cls in PIPELINES:
        model, opt = _dlrm_dmp(world_size)
        pipeline = cls(model, opt, torch.device("cpu"))
        out[cls.__name__] = [float(loss) for epoch in epochs for loss in _drain(pipeline, iter(epoch))]
        out[cls.__name__ + "_tables"] = gather_full_state_dict(model.state_dict())
    return out


def test_sharded_dlrm_epochs_and_short_loaders_train_like_the_plain_loop() -> None:
    for res in run_ranks(_sharded_body, world_size=2, timeout=300):
        assert len(res["plain"]) == 6
        for cls in PIPELINES:
            assert res[cls.__name__] == res["plain"], cls.__name__
            for key, value in res["plain_tables"].items():
                assert torch.equal(res[cls.__name__ + "_tables"][key], value), (cls.__name__, key)
