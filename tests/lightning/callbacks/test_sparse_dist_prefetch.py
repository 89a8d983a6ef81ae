"""SparseDistPrefetch and the input-dist pipelining under it, on real gloo ranks.

* ``DistributedModelParallel`` driven by hand (row-wise, table-wise, column-wise and data-parallel
  tables): the input dist of batch i+1 is started before batch i's forward and progressed before
  its backward, an evaluation forward comes in between -- losses, tables and dense parameters are
  bit-identical to the plain loop, the input dist of batch i+1 really ran before backward i, and
  no lookup ran outside a forward.
* ``Trainer.fit`` on 2 ranks with a mixed plan, with and without the callback: identical per-step
  losses and final tables, across epoch ends (last batch: nothing to prefetch), validation between
  two steps, and ``max_steps`` reached mid-epoch (the prefetched batch is dropped); for a sized and
  an unsized (iterable) loader.
* The callback is a no-op with one warning when the world size is 1 or there is no sharded collection.
* Stream order: the side stream waits for the main stream before it copies (or reads) a batch
  that may already be on the device (spy streams on CPU; a ``gpu``-marked CUDA twin).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.multiprocess import free_port, run_nccl, run_ranks, set_torchrun_env

# ---------------------------------------------------------------------------------------------
# DistributedModelParallel driven by hand


def _dmp_run(rank: int, world_size: int, pipelined: bool) -> dict[str, Any]:
    import copy

    from lightrec.distributed import DistributedModelParallel
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter
    from tests.distributed.test_dmp import _batch, _dlrm, _mixed_plan, _sharders, _slice

    steps, local = 4, 4
    model = DistributedModelParallel(copy.deepcopy(_dlrm("cpu")), device="cpu", plan=_mixed_plan(world_size),
                                     sharders=_sharders())  # fmt: skip
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [model.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1))]
    )
    pipeline = model.pipeline
    (target,) = pipeline.collections

    def local_batch(step: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
        x, kjt, y = _batch(step, local * world_size)
        lo = rank * local
        return x[lo : lo + local], _slice(kjt, lo, local), y[lo : lo + local]

    batches = [local_batch(s) for s in range(steps + 1)]  # the last one is started, then cancelled
    step_of = {id(b[1].values()): s for s, b in enumerate(batches)}
    events: list[tuple[str, int]] = []
    for d in target._input_dists:
        d.register_forward_hook(
            lambda m, args, out: events.append(("input_dist", step_of.get(id(args[0].values()), -1)))
        )
    for lookup in target._lookups:
        lookup.register_forward_hook(lambda m, args, out: events.append(("lookup", -1)))

    bce = torch.nn.BCEWithLogitsLoss()
    losses = []
    if pipelined:
        pipeline.start(batches[0][1])
        pipeline.progress()
    for step in range(steps):
        x, kjt, y = batches[step]
        if pipelined:
            assert pipeline.start(batches[step + 1][1])  # stage 1 of the next batch
        events.append(("forward", step))
        loss = bce(model(x, kjt).squeeze(1), y)
        events.append(("forward_done", step))
        if pipelined:
            pipeline.progress()  # stage 2 of the next batch, before this backward
            assert pipeline.started_for(batches[step + 1][1])
        events.append(("backward", step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 1:  # an evaluation forward while the next batch's input dist is pending
            xe, kjte, _ = local_batch(100)
            events.append(("forward", 100))
            with torch.no_grad():
                losses.append(model(xe, kjte).sum().item())
            events.append(("forward_done", 100))
    cancelled = pipeline.cancel(wait=True)
    full = model.gather_full_state_dict()
    return {"losses": losses, "full": full, "events": events, "cancelled": cancelled}


def _dmp_body(rank: int, world_size: int) -> dict[str, Any]:
    return {"plain": _dmp_run(rank, world_size, False), "piped": _dmp_run(rank, world_size, True)}


def test_dmp_pipelined_input_dist_is_bit_identical() -> None:
    results = run_ranks(_dmp_body, 2, timeout=180)
    for rank, r in enumerate(results):
        p, q = r["plain"], r["piped"]
        assert q["losses"] == p["losses"], f"rank {rank}"
        assert set(q["full"]) == set(p["full"])
        for key, value in p["full"].items():
            assert torch.equal(q["full"][key], value), f"rank {rank}: {key} differs"
        assert p["cancelled"] == 0 and q["cancelled"] == 1
        events = q["events"]
        for step in range(4):
            fwd, done, bwd = (events.index((k, step)) for k in ("forward", "forward_done", "backward"))
            inside = events[fwd:done]
            # the forward consumed the input dist started earlier: only lookups ran in it
            assert ("lookup", -1) in inside and not any(k == "input_dist" for k, _ in inside), inside
            # the next batch's input dist ran before this backward, and before this forward
            first_next = events.index(("input_dist", step + 1))
            assert first_next < fwd < bwd
        # lookups only ever ran inside a forward (never while an input dist was started ahead)
        depth = 0
        for kind, _ in events:
            depth += (kind == "forward") - (kind == "forward_done")
            assert kind != "lookup" or depth == 1, events
        assert sum(k == "lookup" for k, _ in events) == sum(k == "lookup" for k, _ in p["events"])
    assert results[0]["piped"]["losses"] != results[1]["piped"]["losses"]  # the ranks saw different samples


# ---------------------------------------------------------------------------------------------
# Trainer.fit with and without the callback

EPOCH_BATCHES, MAX_STEPS = 3, 7  # two full epochs, then max_steps stops the third after one batch


@pytest.fixture(scope="module")
def fit_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One launch of 2 ranks: four fits (sized / iterable loader, with / without the callback)."""
    tmp = str(tmp_path_factory.mktemp("fit"))
    return run_ranks(_fit_body, 2, args=(free_port(), tmp), timeout=300)


class _Unsized(torch.utils.data.IterableDataset):
    """The batches of a loader, without a length (Lightning then pre-reads the next batch itself)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)


def _datamodule(world_size: int, sized: bool) -> Any:
    from tests.lightning.toy import toy_data

    data = toy_data(batch_size=16, num_train_batches=EPOCH_BATCHES * world_size, block_size=16)
    if not sized:
        sized_loader = data.train_dataloader
        data.train_dataloader = lambda: torch.utils.data.DataLoader(_Unsized(sized_loader()), batch_size=None)
    return data


def _fit(world_size: int, sized: bool, prefetch: bool, tmp: str, accelerator: str = "cpu") -> dict[str, Any]:
    import lightning.pytorch as pl

    from lightrec.distributed.planner import (
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from lightrec.distributed.types import ShardingPlan
    from lightrec.lightning import RecStrategy
    from lightrec.lightning.callbacks.sparse_dist_prefetch import SparseDistPrefetch
    from tests.lightning.toy import ToyDLRM

    losses: list[float] = []
    pending_before_backward: list[bool] = []

    dmps: list[Any] = []

    class Record(pl.Callback):
        def on_train_start(self, trainer, module) -> None:  # noqa: ANN001
            dmps.append(trainer.strategy.dmp)  # RecStrategy.teardown forgets it

        def on_before_backward(self, trainer, module, loss) -> None:  # noqa: ANN001
            pending_before_backward.append(trainer.strategy.dmp.pipeline.started_for())

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    ebc = ToyDLRM(device="meta").model.sparse_arch.embedding_bag_collection
    kinds = [row_wise(), data_parallel(), table_wise(rank=world_size - 1)]
    per_table = {t.name: kinds[i % 3] for i, t in enumerate(ebc.embedding_bag_configs())}
    plan = ShardingPlan({
        "model.sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
            ebc, per_table, world_size=world_size, local_size=world_size,
            device_type="cuda" if accelerator == "gpu" else "cpu")
    })  # fmt: skip
    callbacks = [SparseDistPrefetch(), Record()] if prefetch else [Record()]
    trainer = pl.Trainer(
        accelerator=accelerator, devices=world_size, max_epochs=3, max_steps=MAX_STEPS, num_sanity_val_steps=0,
        val_check_interval=2, limit_val_batches=1,  # validation between steps 2 and 3 of every epoch
        strategy=RecStrategy(plan=plan, fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, default_root_dir=tmp,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=_datamodule(world_size, sized))
    dmp = dmps[0]
    return {
        "losses": losses,
        "pending": pending_before_backward,
        "full": dmp.gather_full_state_dict(),
        "left": dmp.pipeline.started_for(),
        "val_loss": float(trainer.callback_metrics["val/loss"]),
    }


def _fit_body(rank: int, world_size: int, port: int, tmp: str, accelerator: str = "cpu") -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    out = {}
    for sized in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plain = _fit(world_size, sized, False, tmp, accelerator)
            piped = _fit(world_size, sized, True, tmp, accelerator)
        out["sized" if sized else "iterable"] = {
            "plain": plain,
            "piped": piped,
            "warnings": [str(w.message) for w in caught],
        }
    return out


@pytest.mark.parametrize("loader", ["sized", "iterable"])
def test_fit_with_prefetch_is_bit_identical(fit_results: list[dict[str, Any]], loader: str) -> None:
    """A sized loader (the callback reads the next batch ahead) and an iterable one without length
    (Lightning already holds the next batch)."""
    for rank, both in enumerate(fit_results):
        r = both[loader]
        plain, piped = r["plain"], r["piped"]
        assert len(plain["losses"]) == MAX_STEPS
        assert piped["losses"] == plain["losses"], f"rank {rank}"
        assert piped["val_loss"] == plain["val_loss"]
        assert set(piped["full"]) == set(plain["full"])
        for key, value in plain["full"].items():
            assert torch.equal(piped["full"][key], value), f"rank {rank}: {key} differs"
        # the next batch's input dist was in flight at every backward that has a next batch in its
        # epoch; the last batch of an epoch has none; the batch prefetched when max_steps stopped
        # the third epoch was dropped
        assert piped["pending"] == [True, True, False, True, True, False, True]
        assert plain["pending"] == [False] * MAX_STEPS
        assert not piped["left"]
        assert not any("SparseDistPrefetch" in w for w in r["warnings"]), r["warnings"]
    assert fit_results[0][loader]["piped"]["losses"] != fit_results[1][loader]["piped"]["losses"]


# ---------------------------------------------------------------------------------------------
# No-op cases


def _one_rank_body(rank: int, world_size: int, port: int, tmp: str) -> list[str]:
    set_torchrun_env(0, 1, port)
    import lightning.pytorch as pl

    from lightrec.lightning import RecStrategy
    from lightrec.lightning.callbacks.sparse_dist_prefetch import SparseDistPrefetch
    from tests.lightning.toy import ToyDLRM, toy_data

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=3, limit_val_batches=0, strategy=RecStrategy(),
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[SparseDistPrefetch()], default_root_dir=tmp,
        )  # fmt: skip
        module = ToyDLRM(device="meta")
        trainer.fit(module, datamodule=toy_data(batch_size=8, num_train_batches=4, block_size=8))
        assert not module.model.sparse_arch.embedding_bag_collection.ahead.started_for()
    return [str(w.message) for w in caught if "SparseDistPrefetch" in str(w.message)]


def test_world_size_one_is_a_noop_with_one_warning(tmp_path: Any) -> None:
    messages = run_ranks(_one_rank_body, 1, args=(free_port(), str(tmp_path)), timeout=120)[0]
    assert len(messages) == 1 and "world size is 1" in messages[0], messages


def test_model_without_sharded_collection_is_a_noop_with_one_warning(tmp_path: Any) -> None:
    import lightning.pytorch as pl

    from lightrec.lightning.callbacks.sparse_dist_prefetch import SparseDistPrefetch

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.randn(6, 3), batch_size=2)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[SparseDistPrefetch()],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Tiny(), data)
    messages = [str(w.message) for w in caught if "SparseDistPrefetch" in str(w.message)]
    assert len(messages) == 1 and "0 sharded embedding collections" in messages[0], messages


@pytest.mark.gpu
def test_fit_with_prefetch_on_a_gpu_matches_without(tmp_path: Any) -> None:
    """On one GPU (NCCL group of size 1) the callback runs (a host-to-device copy and a host sync to
    hide): the copy and both input-dist stages go to its side stream, and the per-step losses and
    tables equal training without it (up to CUDA's nondeterministic atomic adds)."""
    both = run_nccl(_fit_body, args=(free_port(), str(tmp_path), "gpu"), timeout=300)
    for loader in ("sized", "iterable"):
        plain, piped = both[loader]["plain"], both[loader]["piped"]
        assert len(plain["losses"]) == MAX_STEPS
        assert piped["losses"] == pytest.approx(plain["losses"], rel=1e-5, abs=1e-6)
        for key, value in plain["full"].items():
            torch.testing.assert_close(piped["full"][key], value, rtol=1e-5, atol=1e-6)
        assert piped["pending"] == [True, True, False, True, True, False, True]
        assert not any("SparseDistPrefetch" in w for w in both[loader]["warnings"])


# ---------------------------------------------------------------------------------------------
# Stream order of the look-ahead copy: the side stream waits for the main stream first


class _SpyStream:
    """Stands in for a ``torch.cuda.Stream`` on CPU; logs what the code under test does with it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _SpyStream) -> None:
        self.log.append(f"{self.name}.wait_stream({other.name})")


def test_side_stream_waits_for_the_main_stream_before_reading_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch may already be on the device, written by kernels queued on the main stream: the
    side stream must be ordered after them *before* the copy (and the input dist) is issued on it.
    Runs the callback's real ``_to_device`` with spy streams (the CUDA twin is below)."""
    import contextlib
    from types import SimpleNamespace

    from lightrec.lightning import SparseDistPrefetch

    log: list[str] = []
    main, side = _SpyStream("main", log), _SpyStream("side", log)

    @contextlib.contextmanager
    def on(stream: _SpyStream):  # noqa: ANN202
        log.append(f"enter {stream.name}")
        yield
        log.append(f"exit {stream.name}")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", on)

    def batch_to_device(batch: Any, dataloader_idx: int) -> Any:
        log.append("batch_to_device")
        return batch

    strategy = SimpleNamespace(root_device=torch.device("cuda", 0), batch_to_device=batch_to_device)
    callback = SparseDistPrefetch()
    callback._copy_stream = side  # type: ignore[assignment]
    batch = torch.ones(3)
    assert callback._to_device(SimpleNamespace(strategy=strategy), batch) is batch  # type: ignore[arg-type]
    assert log == ["side.wait_stream(main)", "enter side", "batch_to_device", "exit side"]


@pytest.mark.gpu
def test_side_stream_reads_a_batch_still_being_written_on_the_main_stream() -> None:
    """CUDA twin: the batch is written on the main stream behind a long kernel; what the side
    stream computes from it after ``_to_device`` must see the written values."""
    from types import SimpleNamespace

    from lightrec.lightning import SparseDistPrefetch

    device = torch.device("cuda", torch.cuda.current_device())
    strategy = SimpleNamespace(root_device=device, batch_to_device=lambda batch, dataloader_idx: batch)
    callback = SparseDistPrefetch()
    callback._copy_stream = torch.cuda.Stream(device=device)
    for _ in range(3):
        batch = torch.zeros(1 << 20, device=device)
        torch.cuda._sleep(50_000_000)  # ~tens of ms of queued work before the batch is written
        batch.fill_(1.0)
        moved = callback._to_device(SimpleNamespace(strategy=strategy), batch)  # type: ignore[arg-type]
        with torch.cuda.stream(callback._copy_stream):
            total = moved.sum()
        torch.cuda.synchronize()
        assert float(total) == float(1 << 20)
