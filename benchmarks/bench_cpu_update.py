"""The fused update on CPU: the torch kernel's native pass against its stock-op update and fbgemm's.

One rank's share of the sharded benchmark (``bench_dmp.py``): 13 tables x 100k rows x dim 64, the
global batch of 2 ranks (4096 samples), one id per bag, uniform ids, one thread. For each optimizer
every contender runs forward + backward (the backward IS the update) on the same batches, the
contenders interleaved round-robin so that load from other jobs hits all alike:

* ``today``: the torch kernel as it was before the native update -- the stock-op update
  (``sparse_update.apply_sparse_update``) on tables in ordinary 4 KiB pages;
* ``stock_hugepages``: the stock-op update on today's huge-page tables (``LIGHTREC_CPU_UPDATE_NATIVE=0``);
* ``native``: the native pass (``kernels/cpu_update.py``) on huge-page tables -- what runs now;
* ``fbgemm``: fbgemm's TBE with its fused CPU backward, where it serves the optimizer.

Reported per contender: median milliseconds of the backward (the update) and of forward +
backward, as wall time and as thread CPU time (which other jobs disturb less), and the update's
speed-up over ``today``.

Run::

    python benchmarks/bench_cpu_update.py                    # every optimizer, JSON to stdout
    python benchmarks/bench_cpu_update.py --optimizers rowwise_adagrad --iters 15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import BatchedEmbeddingBag, FusedOptimizerSpec
from lightrec.optim.fused_spec import EmbOptimType

OPTIMIZERS = {
    "sgd": EmbOptimType.SGD,
    "adagrad": EmbOptimType.ADAGRAD,
    "rowwise_adagrad": EmbOptimType.ROWWISE_ADAGRAD,
    "adam": EmbOptimType.ADAM,
}


def _torch_kernel(
    args: argparse.Namespace, spec: FusedOptimizerSpec, native: bool, huge: bool
) -> BatchedEmbeddingBag:
    os.environ["LIGHTREC_CPU_UPDATE_NATIVE"] = "1" if native else "0"
    try:
        module = BatchedEmbeddingBag(
            [(args.rows, args.dim)] * args.tables, optimizer=spec, kernel_backend="torch"
        )
    finally:
        os.environ.pop("LIGHTREC_CPU_UPDATE_NATIVE")
    if not huge:  # today's storage: ordinary pages (a plain copy is not madvised)
        kernel = module._backend
        for g in kernel.groups:  # type: ignore[attr-defined]
            g.weight = g.weight.clone()
            g.states = {k: v.clone() for k, v in g.states.items()}
        for name, view in zip(module.weights, kernel.split_embedding_weights()):
            module.weights[name].data = view
    return module


def _contenders(args: argparse.Namespace, kind: EmbOptimType) -> dict[str, BatchedEmbeddingBag]:
    spec = FusedOptimizerSpec(kind, learning_rate=0.01)
    out = {
        "today": _torch_kernel(args, spec, native=False, huge=False),
        "stock_hugepages": _torch_kernel(args, spec, native=False, huge=True),
        "native": _torch_kernel(args, spec, native=True, huge=True),
    }
    if fbgemm_available() and kind != EmbOptimType.ADAM:  # fbgemm has no CPU Adam
        out["fbgemm"] = BatchedEmbeddingBag([(args.rows, args.dim)] * args.tables, optimizer=spec,
                                            kernel_backend="fbgemm")  # fmt: skip
    return out


def _measure(args: argparse.Namespace, kind: EmbOptimType) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    n = args.tables * args.batch
    batches = [(torch.randint(0, args.rows, (n,), generator=gen), torch.arange(n + 1)) for _ in range(4)]
    grads = [torch.randn(args.batch, args.tables * args.dim, generator=gen) for _ in range(4)]
    modules = _contenders(args, kind)
    times: dict[str, dict[str, list[float]]] = {
        k: {"bwd": [], "bwd_cpu": [], "step": [], "step_cpu": []} for k in modules
    }
    names = list(modules)
    for i in range(args.warmup + args.iters):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            ids, offsets = batches[i % 4]
            t0, c0 = time.perf_counter(), time.thread_time()
            out = modules[name](ids, offsets)
            t1, c1 = time.perf_counter(), time.thread_time()
            out.backward(grads[i % 4])
            t2, c2 = time.perf_counter(), time.thread_time()
            if i >= args.warmup:
                rec = times[name]
                rec["bwd"].append(t2 - t1)
                rec["bwd_cpu"].append(c2 - c1)
                rec["step"].append(t2 - t0)
                rec["step_cpu"].append(c2 - c0)
    result = {
        name: {k + "_ms": 1000.0 * statistics.median(v) for k, v in rec.items()}
        for name, rec in times.items()
    }
    for r in result.values():
        r["update_speedup_vs_today"] = result["today"]["bwd_cpu_ms"] / r["bwd_cpu_ms"]
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=13)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    parser.add_argument("--out", help="write the JSON here as well")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report: dict = {
        "benchmark": "bench_cpu_update",
        "config": vars(args),
        "machine": {"torch": torch.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count()},
        "load_average_start": list(os.getloadavg()),
        "results": {},
    }
    for name in args.optimizers:
        res = _measure(args, OPTIMIZERS[name])
        report["results"][name] = res
        for contender, r in res.items():
            print(f"{name:16s} {contender:16s} update {r['bwd_ms']:7.1f} ms wall {r['bwd_cpu_ms']:7.1f} ms cpu   "
                  f"fwd+bwd {r['step_ms']:7.1f} / {r['step_cpu_ms']:7.1f}   x{r['update_speedup_vs_today']:.2f} vs today",
                  file=sys.stderr, flush=True)  # fmt: skip
    report["load_average_end"] = list(os.getloadavg())
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return report


if __name__ == "__main__":
    main()
