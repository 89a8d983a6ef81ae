"""Train pipelines after a forward that raises, and with ``train()``/``eval()`` switched between steps.

A ``progress`` whose forward raises leaves its batch at the head: the next call trains it again, then
the batches read after it. So a loop that catches the error and calls ``progress`` again trains every
batch once, in order, like the plain loop (forward, backward, ``optimizer.step`` per batch), and a
retry reads no further batches from the iterator. In one process on a dense model, and on 2 gloo ranks
on a DLRM sharded by ``DistributedModelParallel`` (the forward raising before and after its sharded
collection took the input dist started ahead)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightrec.datasets.random import RandomRecDataset
from lightrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from tests.distributed.test_review_pipeline_epochs import _Batch, _Dense, _epoch, _plain_dense
from tests.distributed.test_train_pipeline import KEYS, _dlrm_dmp, _plain
from tests.multiprocess import run_ranks

PIPELINES = [TrainPipelineBase, TrainPipelineSparseDist]


class _Counting:
    """An iterator over ``items`` that counts how many were read."""

    def __init__(self, items: list) -> None:
        self._it, self.read = iter(items), 0

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> object:
        item = next(self._it)
        self.read += 1
        return item


def _train_through_failures(pipeline, it: _Counting, fail_calls: set[int], depth: int) -> list[float]:  # noqa: ANN001
    """Call ``progress`` until ``StopIteration``, catching the errors the forward raises on ``fail_calls``."""
    losses: list[float] = []
    calls = 0
    while True:
        calls += 1
        try:
            losses.append(float(pipeline.progress(it)[0]))
        except StopIteration:
            return losses
        except RuntimeError as error:
            assert calls in fail_calls and "injected" in str(error)
        assert it.read <= len(losses) + depth, (calls, it.read, len(losses))  # no batch read beyond the pipeline


@pytest.mark.parametrize("pipeline_cls", PIPELINES, ids=lambda c: c.__name__)
def test_a_forward_that_raises_loses_no_batch(pipeline_cls: type) -> None:
    batches = _epoch(6, 7, last_size=3)
    want_model, want_losses = _plain_dense(batches)
    model = _Dense()
    fail_calls = {3, 4, 5}  # batch 2 fails three times in a row
    calls = 0

    def fwd(batch: _Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        nonlocal calls
        calls += 1
        if calls in fail_calls:
            raise RuntimeError("injected forward failure")
        return model(batch)

    pipeline = pipeline_cls(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                            custom_model_fwd=fwd)  # fmt: skip
    depth = 2 if pipeline_cls is TrainPipelineBase else 3  # batches read ahead of the trained ones, at most
    losses = _train_through_failures(pipeline, _Counting(batches), fail_calls, depth)
    assert losses == want_losses  # every batch once, in order (was: TrainPipelineBase dropped batch 3)
    for got, want in zip(model.parameters(), want_model.parameters(), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("pipeline_cls", PIPELINES, ids=lambda c: c.__name__)
def test_eval_steps_between_training_steps_do_not_train(pipeline_cls: type) -> None:
    batches, evals = _epoch(5, 8), {1, 3}
    want_model = _Dense()
    opt = torch.optim.SGD(want_model.parameters(), lr=0.1)
    want = []
    for i, batch in enumerate(batches):
        if i in evals:
            want.append(float(want_model(batch)[1][0]))
        else:
            want += _plain(want_model, opt, [batch])
    model = _Dense()
    pipeline = pipeline_cls(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    it, got = iter(batches), []
    for i in range(len(batches)):
        model.train(i not in evals)
        got.append(float(pipeline.progress(it)[0]))
    assert got == want
    for a, b in zip(model.parameters(), want_model.parameters(), strict=True):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- 2 gloo ranks
def _body(rank: int, world_size: int) -> dict:
    from lightrec.distributed import gather_full_state_dict

    batches = list(RandomRecDataset(keys=KEYS, batch_size=8, hash_size=40, ids_per_features=[1, 2, 3], num_dense=4,
                                    manual_seed=rank, num_batches=5, num_generated_batches=-1))  # fmt: skip
    model, opt = _dlrm_dmp(world_size)
    out: dict = {"plain": _plain(model, opt, batches), "plain_tables": gather_full_state_dict(model.state_dict())}
    for cls in PIPELINES:
        model, opt = _dlrm_dmp(world_size)
        calls = 0

        def fwd(batch: object, model=model) -> tuple:  # noqa: ANN001
            nonlocal calls
            calls += 1
            if calls == 3:  # before the sharded collection took its input dist (started a step ahead)
                raise RuntimeError("injected forward failure")
            result = model(batch)
            if calls == 4:  # after it: the retry runs the input dist in the forward
                raise RuntimeError("injected forward failure")
            return result

        pipeline = cls(model, opt, torch.device("cpu"), custom_model_fwd=fwd)
        out[cls.__name__] = _train_through_failures(pipeline, _Counting(batches), {3, 4}, depth=3)
        out[cls.__name__ + "_tables"] = gather_full_state_dict(model.state_dict())
    return out


@pytest.mark.slow  # ~13 s: two pipelines and the plain loop on 2 gloo ranks
def test_sharded_dlrm_forward_failures_train_like_the_plain_loop() -> None:
    for res in run_ranks(_body, world_size=2, timeout=240):
        assert len(res["plain"]) == 5
        for cls in PIPELINES:
            assert res[cls.__name__] == res["plain"], cls.__name__
            for key, value in res["plain_tables"].items():
                assert torch.equal(res[cls.__name__ + "_tables"][key], value), (cls.__name__, key)
