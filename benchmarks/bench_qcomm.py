"""Quantized communication on 2 gloo ranks: step time and bytes of the embedding output dists per
precision (lightrec.distributed.fbgemm_qcomm_codec), against fp32 communication in the same run.

Model: a sharded ``EmbeddingBagCollection`` of ``--tables`` tables x ``--rows`` x ``--dim`` (half
table-wise, half row-wise, so both the pooled all-to-all and the reduce-scatter run), fused SGD,
``--batch-size`` samples per rank, ``--pooling`` ids per bag. A step is the forward (input dist,
lookup, output dist), a backward through a fixed random projection of the output (the gradient
all-to-all / all-gather and the fused update). Contenders (fp32, fp16, bf16, fp8, int8) alternate
for ``--repeats`` rounds; each round times ``--steps`` steps after ``--warmup``; the slower rank's
time counts. Printed (JSON): median step time and speed-up over fp32 per precision, and the bytes
the output dists sent per step (forward + backward, both ranks).

On CPU the codecs' encode/decode costs compute that gloo over loopback does not give back (a
loopback all-to-all is a memory copy); the byte saving pays off where the link is the bottleneck
(between hosts, or NCCL over a network).

Run::

    python benchmarks/bench_qcomm.py
    python benchmarks/bench_qcomm.py --tables 26 --rows 100000 --dim 128 --batch-size 4096 --out qcomm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8")


def _sharded(args: argparse.Namespace, precision: str) -> Any:
    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.fbgemm_qcomm_codec import QCommsConfig, get_qcomm_codecs_registry
    from lightrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{i}"])
              for i in range(args.tables)]  # fmt: skip
    ebc = EmbeddingBagCollection(tables, device="meta")
    gens = {t.name: (table_wise(i % 2) if i < args.tables // 2 else row_wise()) for i, t in enumerate(tables)}
    plan = construct_module_sharding_plan(ebc, gens, world_size=2)
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=precision, backward_precision=precision))
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": 0.01},
                                            qcomm_codecs_registry=registry)  # fmt: skip
    return sharder.shard(ebc, plan, ShardingEnv.from_process_group(None), torch.device("cpu"))


def _batches(args: argparse.Namespace, rank: int) -> list[Any]:
    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(rank)
    keys = [f"f{i}" for i in range(args.tables)]
    out = []
    for _ in range(4):
        lengths = torch.full((args.tables * args.batch_size,), args.pooling, dtype=torch.int64)
        out.append(KeyedJaggedTensor(keys=keys, values=torch.randint(0, args.rows, (int(lengths.sum()),), generator=g),
                                     lengths=lengths))  # fmt: skip
    return out


def _bytes_of_one_step(model: Any, kjt: Any, projection: torch.Tensor) -> int:
    from lightrec.distributed.comm import _primitives

    sent: list[int] = []
    real, real_gather = dist.all_to_all_single, _primitives.all_gather_single

    def count(fn: Any) -> Any:
        def wrapped(output: torch.Tensor, input: torch.Tensor, *a: Any, **k: Any) -> Any:
            if input.dtype in (torch.float32, torch.uint8):  # the embedding rows (the KJT exchanges send ints)
                sent.append(input.numel() * input.element_size())
            return fn(output, input, *a, **k)

        return wrapped

    dist.all_to_all_single, _primitives.all_gather_single = count(real), count(real_gather)
    try:
        (model(kjt).wait().values() @ projection).sum().backward()
    finally:
        dist.all_to_all_single, _primitives.all_gather_single = real, real_gather
    total = torch.tensor([sum(sent)], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total)


def _rank(rank: int, args: argparse.Namespace, init: str, results: Any) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    models = {p: _sharded(args, p) for p in PRECISIONS}
    batches = _batches(args, rank)
    projection = torch.randn(args.tables * args.dim, 8, generator=torch.Generator().manual_seed(9))
    times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    bytes_per_step = {p: _bytes_of_one_step(models[p], batches[0], projection) for p in PRECISIONS}
    for r in range(args.repeats):
        order = PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]
        for p in order:
            model = models[p]
            for i in range(args.warmup + args.steps):
                if i == args.warmup:
                    dist.barrier()
                    start = time.perf_counter()
                (model(batches[i % len(batches)]).wait().values() @ projection).sum().backward()
            elapsed = torch.tensor([(time.perf_counter() - start) / args.steps])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[p].append(float(elapsed))
    if rank == 0:
        base = statistics.median(times["fp32"])
        results.put({
            p: {"step_ms": 1e3 * statistics.median(times[p]), "speedup_vs_fp32": base / statistics.median(times[p]),
                "bytes_per_step": bytes_per_step[p], "bytes_vs_fp32": bytes_per_step[p] / bytes_per_step["fp32"]}
            for p in PRECISIONS
        })  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--pooling", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        procs = [ctx.Process(target=_rank, args=(r, args, init, results)) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    if any(proc.exitcode for proc in procs):
        raise SystemExit("a rank failed")
    report = {"config": vars(args), "results": results.get()}
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
