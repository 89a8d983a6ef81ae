"""What the per-step reliability checks cost on the main job's training step.

The main job (``lightrec run dlrm --devices 2``, ``recipes/configs/dlrm.yaml``): DLRM, 26 Criteo
tables (Kaggle cardinalities capped at 100k rows, dim 16), bottom MLP 64-16, top MLP 64-32-1,
fused row-wise Adagrad (lr 0.05) + dense Adagrad (lr 0.05), ``SyntheticCriteo`` batches of 1024
samples per rank, 2 gloo ranks (``RecStrategy``), one intra-op thread each.

One ``Trainer.fit`` per rank; after ``--warmup`` steps, windows of ``--steps`` steps alternate
between the two contenders (so both see the same machine load of the moment):

* ``off``: ``RecModule(nonfinite_loss=None)``, no input validation, and the sharded collection's
  always-on input check replaced by a no-op (for this measurement only: it has no off switch);
* ``on``: ``nonfinite_loss="raise"`` (one all-gather of a flag + a host read per step),
  ``KeyedJaggedTensor.validate()`` of every batch (dtype, per-feature length and offset checks) and
  the collection's input check ``check_collection_input`` (ids' dtypes, the parts' sizes, negative
  lengths, surplus values; issue 23 added the sizes and the negative-length pass).

Prints the median window's ms/step for each and their difference, plus each check alone timed
over the same batches on rank 0 (``validate()``; the loss check with its all-gather, both ranks;
``check_collection_input`` on a fresh KJT, so its ``length_per_key`` is computed, not cached; and
its data pass alone, ``check_lengths_and_weights``).

Run::

    python benchmarks/bench_checks.py                    # 20 windows of 10 steps
    python benchmarks/bench_checks.py --windows 6 --steps 5   # quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.multiprocessing as mp


def _module_and_data(args: argparse.Namespace) -> tuple[Any, Any]:
    from lightrec.data import SyntheticCriteo
    from lightrec.lightning import RecModule
    from lightrec.models import DLRM

    data = SyntheticCriteo(
        batch_size=args.batch_size, num_train_batches=args.world * (args.warmup + 2 * args.windows * args.steps + 2),
        num_val_batches=1, num_test_batches=1, seed=0, cardinalities="kaggle", num_embeddings_cap=100_000,
    )  # fmt: skip

    class MainJobDLRM(RecModule):
        def table_configs(self) -> list[Any]:
            return data.table_configs(16)

        def build_model(self, embedding_bag_collection: Any) -> Any:
            return DLRM(embedding_bag_collection, 13, [64, 16], [64, 32, 1])

        def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
            return self.model(dense, sparse)

    module = MainJobDLRM(dense_optimizer="adagrad", dense_lr=0.05, embedding_lr=0.05)
    return module, data


def _worker(rank: int, args: argparse.Namespace, port: int, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(args.world), LOCAL_WORLD_SIZE=str(args.world), NODE_RANK="0", OMP_NUM_THREADS="1",
    )  # fmt: skip
    torch.set_num_threads(1)
    import lightning.pytorch as pl

    import lightrec.distributed.sharding.collection as sharded_collection
    from lightrec.lightning import RecStrategy
    from lightrec.lightning.nonfinite import nonfinite_ranks
    from lightrec.modules.feature_checks import check_collection_input
    from lightrec.sparse import KeyedJaggedTensor
    from lightrec.sparse.kjt_checks import check_lengths_and_weights

    def no_check(*_: Any, **__: Any) -> None:
        return None

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    module, data = _module_and_data(args)
    windows: dict[str, list[float]] = {"off": [], "on": []}
    alone: dict[str, list[float]] = {
        "validate": [], "loss check": [], "collection input check": [], "  of which the negative-length pass": []
    }  # fmt: skip

    class Windows(pl.Callback):
        def __init__(self) -> None:
            self.started: float | None = None

        def _mode(self, step: int) -> str | None:
            if step < args.warmup:
                return None
            k = (step - args.warmup) // args.steps
            return None if k >= 2 * args.windows else ("on", "off")[(k + k // 2) % 2]  # on,off,off,on,...

        def on_train_batch_start(
            self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            step = trainer.global_step
            mode = self._mode(step)
            if (step - args.warmup) % args.steps == 0 and step >= args.warmup:
                torch.distributed.barrier()
                self.started = time.perf_counter()
            pl_module.nonfinite_loss = "raise" if mode == "on" else None
            sharded_collection.check_collection_input = no_check if mode == "off" else check_collection_input
            if mode == "on":
                batch.sparse_features.validate()

        def on_train_batch_end(
            self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int
        ) -> None:
            step = trainer.global_step - 1  # the step that just finished
            mode = self._mode(step)
            if mode is not None and (step - args.warmup + 1) % args.steps == 0 and self.started is not None:
                windows[mode].append((time.perf_counter() - self.started) * 1e3 / args.steps)
            if mode is not None and step % args.steps == 0:  # each check alone, on this step's batch
                t0 = time.perf_counter()
                batch.sparse_features.validate()
                alone["validate"].append((time.perf_counter() - t0) * 1e3)
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                t0 = time.perf_counter()
                nonfinite_ranks(loss)
                alone["loss check"].append((time.perf_counter() - t0) * 1e3)
                kjt = batch.sparse_features
                fresh = KeyedJaggedTensor(kjt.keys(), kjt.values(), kjt.weights_or_none(), lengths=kjt.lengths())
                t0 = time.perf_counter()
                check_collection_input(fresh, kjt.keys(), "bench")
                alone["collection input check"].append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                check_lengths_and_weights(kjt.keys(), kjt.lengths(), None, None)
                alone["  of which the negative-length pass"].append((time.perf_counter() - t0) * 1e3)

    trainer = pl.Trainer(
        accelerator="cpu", devices=args.world, strategy=RecStrategy(timeout=timedelta(seconds=600)),
        max_steps=args.warmup + 2 * args.windows * args.steps, num_sanity_val_steps=0, limit_val_batches=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Windows()],
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    if rank == 0:
        queue.put({"windows": windows, "alone": alone})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--windows", type=int, default=10, help="windows per contender")
    parser.add_argument("--steps", type=int, default=10, help="steps per window")
    args = parser.parse_args(argv)
    from tests.multiprocess import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, args, port, queue)) for r in range(args.world)]
    for p in procs:
        p.start()
    raw = queue.get(timeout=3600)
    for p in procs:
        p.join()
    off, on = (statistics.median(raw["windows"][k]) for k in ("off", "on"))
    result = {
        "ms_per_step": {"off": off, "on": on, "difference": on - off, "relative": (on - off) / off},
        "windows": raw["windows"],
        "alone_ms_median": {k: statistics.median(v) for k, v in raw["alone"].items()},
        "args": vars(args),
    }
    print(
        f"main job step, {args.world} gloo ranks x {args.batch_size} samples, {args.windows} windows of {args.steps} steps each:"
    )
    print(
        f"  checks off {off:8.2f} ms/step\n  checks on  {on:8.2f} ms/step   ({on - off:+.2f} ms, {(on - off) / off:+.1%})"
    )
    for k, v in result["alone_ms_median"].items():
        print(f"  {k} alone: {v:.3f} ms")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
