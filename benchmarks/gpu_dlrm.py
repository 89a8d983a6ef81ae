"""Part (b) of ``bench_gpu.py``: a DLRM trained by ``Trainer.fit`` on one device, timed stage by stage.

Model: 13 dense features, the 26 Criteo-Kaggle tables capped at 1M rows, dim 128, bottom MLP
512-256-128, top MLP 1024-1024-512-256-1 (``--smoke``: 1000-row tables, dim 16, small MLPs).
Tables: ``FusedEmbeddingBagCollection`` (exact row-wise Adagrad, ``kernel_backend=--dlrm-backend``) built
on the device; dense layers: Adagrad through ``RecModule.configure_optimizers``. Data:
``SyntheticCriteo(device=<the training device>)`` draws every batch where it is consumed.

Stage boundaries are marked with CUDA events recorded from hooks (no host sync inside a step):

    input        SyntheticCriteo batch generation (the loader fetches batch i+1 before step i)
    lookups      the collection's forward (module hooks), and its backward + fused row update
                 (from the gradient hook on its output to ``on_after_backward``: it runs last)
    dense        everything else between ``on_train_batch_start`` and ``on_after_backward``
    optimizer    ``on_after_backward`` to ``on_train_batch_end`` (dense Adagrad, Lightning's step)
    other        the rest of the period from one step's start to the next (gaps, loop overhead)

A stage's time is the GPU timeline between its marks, idle time included: the numbers add up to
the step period. samples/s is wall time over the measured steps (one synchronize at each end).
On CUDA the measured steps run under ``torch.cuda.set_sync_debug_mode("warn")``; every host sync
they make is counted by source line (``host_syncs_per_step`` in the JSON).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections import Counter
from typing import Any

import torch
from gpu_timer import Timer


class _TimedDataset(torch.utils.data.Dataset):
    """Marks the start and end of every batch's generation (keyed by batch index)."""

    def __init__(self, dataset: Any, timer: Timer, marks: dict[int, dict[str, Any]]) -> None:
        self.dataset, self.timer, self.marks = dataset, timer, marks
        self.batch_size = dataset.batch_size

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # table_configs, device, ... of the wrapped dataset
        return getattr(self.__dict__["dataset"], name)

    def __getitem__(self, index: int) -> Any:
        start = self.timer.mark()
        batch = self.dataset[index]
        self.marks.setdefault(index, {}).update(input_start=start, input_end=self.timer.mark())
        return batch


def _callback(
    timer: Timer, ebc: torch.nn.Module, marks: dict[int, dict[str, Any]], warmup: int, steps: int
) -> Any:
    import lightning.pytorch as pl

    class StageMarks(pl.Callback):
        def __init__(self) -> None:
            self.step = -1
            self.wall: list[float] = []
            ebc.register_forward_pre_hook(lambda *_: self._mark("lookup_fwd_start"))
            ebc.register_forward_hook(self._after_lookup)

        def _mark(self, name: str) -> None:
            marks.setdefault(self.step, {})[name] = timer.mark()

        def _after_lookup(self, module: Any, inputs: Any, output: Any) -> None:
            self._mark("lookup_fwd_end")
            if output.values().requires_grad:
                output.values().register_hook(lambda grad: self._mark("lookup_bwd_start"))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.step = batch_idx
            if batch_idx in (warmup, warmup + steps):  # the measured window's edges
                if timer.cuda:
                    torch.cuda.synchronize()
                    # Every host sync inside the window becomes a warning (counted by run_dlrm).
                    torch.cuda.set_sync_debug_mode("warn" if batch_idx == warmup else "default")
                self.wall.append(time.perf_counter())
            self._mark("step_start")

        def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
            self._mark("backward_start")

        def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
            self._mark("backward_end")

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self._mark("step_end")

    return StageMarks()


def _breakdown(timer: Timer, marks: dict[int, dict[str, Any]], first: int, last: int) -> dict[str, float]:
    stages: dict[str, list[float]] = {k: [] for k in
                                      ("input", "lookups", "dense", "optimizer", "other", "period")}  # fmt: skip
    for i in range(first, last):
        m, nxt = marks[i], marks[i + 1]

        def ms(a: str, b: str, m: dict[str, Any] = m) -> float:
            return timer.ms(m[a], m[b])

        period = timer.ms(m["step_start"], nxt["step_start"])
        lookups = ms("lookup_fwd_start", "lookup_fwd_end") + ms("lookup_bwd_start", "backward_end")
        dense = ms("step_start", "backward_start") - ms("lookup_fwd_start", "lookup_fwd_end")
        dense += ms("backward_start", "lookup_bwd_start")
        optimizer = ms("backward_end", "step_end")
        generation = timer.ms(nxt["input_start"], nxt["input_end"])  # made during this period
        values = {"input": generation, "lookups": lookups, "dense": dense, "optimizer": optimizer}
        values["other"] = period - sum(values.values())
        values["period"] = period
        for k, v in values.items():
            stages[k].append(v)
    return {k: statistics.median(v) for k, v in stages.items()}


def run_dlrm(device: torch.device, args: Any, precision: str = "32-true") -> dict[str, Any]:
    """Train ``--warmup`` + ``--steps`` (+1) steps under Lightning's ``precision`` (``"32-true"``, or
    ``"bf16-mixed"``: the dense layers' matmuls in bf16 under autocast; the tables, their lookups and
    their fused update stay fp32); report samples/s and the median stage times."""
    import lightning.pytorch as pl

    from lightrec.data import SyntheticCriteo
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.lightning import RecModule
    from lightrec.models import DLRM

    smoke, batch_size = args.smoke, args.batch_size
    dim, cap = (16, 1000) if smoke else (128, 1_000_000)
    bottom, top = ([32, dim], [64, 32, 1]) if smoke else ([512, 256, 128], [1024, 1024, 512, 256, 1])
    warmup, steps = max(args.warmup, 2), args.steps
    total = warmup + steps + 2
    data = SyntheticCriteo(batch_size=batch_size, num_train_batches=total, num_val_batches=1, num_test_batches=1,
                           num_embeddings_cap=cap, device=str(device))  # fmt: skip
    timer = Timer(device)
    marks: dict[int, dict[str, Any]] = {}

    class BenchDLRM(RecModule):
        def __init__(self) -> None:
            super().__init__(dense_optimizer="adagrad", dense_lr=0.01, metrics=("ctr",))
            ebc = FusedEmbeddingBagCollection(
                data.table_configs(dim), fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.01},
                device=device, kernel_backend=args.dlrm_backend,
            )  # fmt: skip
            self.model = DLRM(ebc, 13, bottom, top)

        def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
            return self.model(dense, sparse)

    module = BenchDLRM()
    ebc = module.model.sparse_arch.embedding_bag_collection
    data.datasets["train"] = _TimedDataset(data.datasets["train"], timer, marks)  # type: ignore[assignment]
    callback = _callback(timer, ebc, marks, warmup, steps)
    trainer = pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=total - 1, logger=False,
        precision=precision,  # type: ignore[arg-type]  # a str of Lightning's _PRECISION_INPUT
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[callback],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=data)
    if timer.cuda:
        torch.cuda.set_sync_debug_mode("default")
    syncs = Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    wall = callback.wall[1] - callback.wall[0]
    stages = _breakdown(timer, marks, warmup, warmup + steps - 1)
    period = stages.pop("period")
    backend = sorted({lk.backend_name for lk in ebc._lookups})[0]
    return {"backend": backend, "precision": precision, "batch_size": batch_size, "steps": steps, "samples_per_s": batch_size * steps / wall,
            "step_ms": period, "breakdown_ms": stages, "tables": len(data.table_configs(dim)),
            "host_syncs_per_step": {k: v / steps for k, v in syncs.items()} if timer.cuda else None,
            "rows": sum(t.num_embeddings for t in data.table_configs(dim))}  # fmt: skip
