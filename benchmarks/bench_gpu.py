"""GPU speed of lightrec's embedding backends, and of a DLRM trained with ``Trainer.fit`` (issue 13).

(a) Embedding training (forward + backward + fused update, batch 16384, fp32, uniform random ids):

=====================  ============  ===========================================================
workload               ids per bag   contenders
=====================  ============  ===========================================================
26 x 1M x 128          1             ``FusedEmbeddingBagCollection`` (exact row-wise Adagrad) on
26 x 1M x 128          20            every backend that serves the device (fbgemm, triton,
8 x 4M x 128           10            torch), and plain PyTorch: ``nn.EmbeddingBag(sparse=True)``
                                     per table + ``torch.optim.SGD``
=====================  ============  ===========================================================

Each contender is timed with CUDA events (median of ``--iters`` iterations after ``--warmup``,
rotating over 4 pre-generated batches). Achieved bandwidth = the *useful* bytes of one iteration
(rows read by the forward, the output written and its gradient read, every touched row and its
optimizer state read and written once; unique rows counted per batch) over the time, next to a
device-to-device copy (bytes read + written) measured in the same run.

(b) End to end: DLRM with 13 dense features, the 26 Criteo-Kaggle tables capped at 1M rows, dim
128, bottom MLP 512-256-128, top MLP 1024-1024-512-256-1, a ``RecModule`` trained by
``Trainer.fit`` on one GPU (fused row-wise Adagrad tables through ``FusedEmbeddingBagCollection``
with ``kernel_backend="auto"``, Adagrad dense layers), batch 16384, batches drawn on the GPU
(``SyntheticCriteo(device=...)``). Prints samples/s and a per-step breakdown from CUDA events
(input, lookups forward + backward/update, dense forward + backward, optimizer, rest), once per
Lightning precision of ``--dlrm-precision`` (default ``32-true,bf16-mixed``: the second runs the dense
layers in bf16 under autocast, the tables in fp32). See ``benchmarks/gpu_dlrm.py``.

Run (one GPU; prints JSON and a table; ``--out`` also writes the JSON)::

    python benchmarks/bench_gpu.py --out bench_gpu.json
    python benchmarks/bench_gpu.py --only embedding --backends triton,plain     # a subset
    python benchmarks/bench_gpu.py --smoke            # tiny sizes, any machine (CPU included)
    TRITON_INTERPRET=1 python benchmarks/bench_gpu.py --smoke   # ... with the Triton backend on CPU

``--sweep`` also times the Triton backend under a few launch-tile settings (per workload);
``--profile`` lists, on a GPU, the CUDA kernels of one iteration of each fused contender.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import torch
from gpu_timer import Timer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FULL_WORKLOADS = [(26, 1_000_000, 128, 1), (26, 1_000_000, 128, 20), (8, 4_000_000, 128, 10)]
SMOKE_WORKLOADS = [(4, 1_000, 16, 1), (4, 1_000, 16, 20), (2, 4_000, 16, 10)]
SWEEP = [
    {"forward_block_b": 16, "backward_block_n": 8, "num_warps": 4},
    {"forward_block_b": 64, "backward_block_n": 32, "num_warps": 8},
    {"forward_block_b": 32, "backward_block_n": 16, "num_warps": 8},
]


def environment(device: torch.device) -> dict[str, Any]:
    from lightrec._fbgemm import fbgemm_available
    from lightrec._triton import triton_available, triton_interpreting

    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "fbgemm": fbgemm_available(),
        "triton": None,
        "triton_interpreter": triton_interpreting(),
    }
    if triton_available():
        import triton

        info["triton"] = triton.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["sm_count"] = props.multi_processor_count
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def copy_bandwidth(device: torch.device, nbytes: int, iters: int) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), median of ``iters``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    timer, times = Timer(device), []
    for i in range(iters + 3):
        start = timer.mark()
        dst.copy_(src)
        end = timer.mark()
        if i >= 3:
            times.append(timer.ms(start, end))
    return 2 * nbytes / (statistics.median(times) / 1e3)


@dataclass
class Workload:
    tables: int
    rows: int
    dim: int
    ids_per_bag: int
    batch: int

    @property
    def name(self) -> str:
        return f"{self.tables}x{self.rows}x{self.dim}, {self.ids_per_bag} ids/bag"


def _batches(w: Workload, device: torch.device, count: int, seed: int = 0) -> list[Any]:
    """``count`` KJTs (uniform random ids; per-key sizes host-known) and their unique-row counts."""
    from lightrec.sparse import KeyedJaggedTensor

    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    n = w.batch * w.ids_per_bag
    for _ in range(count):
        values = torch.randint(0, w.rows, (w.tables * n,), generator=gen, device=device)
        lengths = torch.full((w.tables * w.batch,), w.ids_per_bag, dtype=torch.int32, device=device)
        kjt = KeyedJaggedTensor([f"f{t}" for t in range(w.tables)], values, lengths=lengths, stride=w.batch,
                                length_per_key=[n] * w.tables)  # fmt: skip
        unique = sum(int(torch.unique(values[t * n : (t + 1) * n]).numel()) for t in range(w.tables))
        out.append((kjt, unique))
    return out


def useful_bytes(w: Workload, unique_rows: float, state_bytes_per_row: int) -> float:
    """Bytes one iteration must move: forward rows, output + its gradient, touched rows (+ state) r/w."""
    row = w.dim * 4
    ids = w.tables * w.batch * w.ids_per_bag
    return ids * row + 2 * w.tables * w.batch * row + unique_rows * 2 * (row + state_bytes_per_row)


def _contender(kind: str, w: Workload, device: torch.device) -> tuple[Any, Any]:
    """``(step(kjt, grad), module)`` of one contender."""
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.modules.embedding_configs import EmbeddingBagConfig

    if kind == "plain":
        bags = torch.nn.ModuleList(
            [
                torch.nn.EmbeddingBag(w.rows, w.dim, mode="sum", sparse=True, device=device)
                for _ in range(w.tables)
            ]
        )
        opt = torch.optim.SGD(bags.parameters(), lr=0.01)

        def plain_step(kjt: Any, grad: torch.Tensor) -> None:
            values, offsets = (
                kjt.values().view(w.tables, -1),
                torch.arange(0, w.batch * w.ids_per_bag, w.ids_per_bag, device=device),
            )
            out = torch.cat([bag(values[t], offsets) for t, bag in enumerate(bags)], dim=1)
            out.backward(grad)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return plain_step, bags
    configs = [EmbeddingBagConfig(num_embeddings=w.rows, embedding_dim=w.dim, name=f"t{t}", feature_names=[f"f{t}"],
                                  init_fn=lambda x: x.uniform_(-0.01, 0.01)) for t in range(w.tables)]  # fmt: skip
    ebc = FusedEmbeddingBagCollection(
        configs,
        fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.01},
        device=device,
        kernel_backend=kind,
    )

    def fused_step(kjt: Any, grad: torch.Tensor) -> None:
        ebc(kjt).values().backward(grad)

    return fused_step, ebc


def time_contender(
    kind: str, w: Workload, device: torch.device, batches: list[Any], args: argparse.Namespace
) -> dict:
    step, module = _contender(kind, w, device)
    grad = torch.randn(w.batch, w.tables * w.dim, device=device)
    timer, times = Timer(device), []
    for i in range(args.warmup + args.iters):
        kjt, _ = batches[i % len(batches)]
        start = timer.mark()
        step(kjt, grad)
        end = timer.mark()
        if i >= args.warmup:
            times.append((start, end))
    ms = statistics.median(timer.ms(s, e) for s, e in times)
    unique = statistics.mean(u for _, u in batches)
    moved = useful_bytes(w, unique, 0 if kind == "plain" else 4)
    backend = kind
    if kind != "plain":
        backend = sorted({lk.backend_name for lk in module._lookups})[0]
    del step, module
    return {"contender": kind, "backend": backend, "ms": ms, "samples_per_s": w.batch / (ms / 1e3),
            "useful_bytes": moved, "bytes_per_s": moved / (ms / 1e3)}  # fmt: skip


def kernel_profile(kind: str, w: Workload, device: torch.device, batches: list[Any], iters: int = 5) -> list[dict]:
    """Where one contender's iteration spends its GPU time: the CUDA kernels of ``iters`` iterations
    under ``torch.profiler``, as ``[{"kernel", "ms_per_iter", "share"}]``, largest first (top 12)."""
    from torch.profiler import ProfilerActivity, profile

    step, _module = _contender(kind, w, device)
    grad = torch.randn(w.batch, w.tables * w.dim, device=device)
    for kjt, _ in batches[:2]:  # compile and warm up outside the trace
        step(kjt, grad)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            step(batches[i % len(batches)][0], grad)
        torch.cuda.synchronize(device)
    # self_device_time_total: the kernel's own GPU time (torch >= 2.4 names it so)
    rows = [(e.key, getattr(e, "self_device_time_total", 0.0)) for e in prof.key_averages()]
    rows = [(k, us) for k, us in rows if us > 0]
    total = sum(us for _, us in rows) or 1.0
    rows.sort(key=lambda r: -r[1])
    return [{"kernel": k[:90], "ms_per_iter": us / 1e3 / iters, "share": us / total} for k, us in rows[:12]]


def available_backends(device: torch.device, wanted: list[str]) -> list[str]:
    from lightrec.kernels import fbgemm_supports
    from lightrec.kernels.triton_backend import triton_supports
    from lightrec.modules.embedding_configs import PoolingType
    from lightrec.optim import EmbOptimType, FusedOptimizerSpec

    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD)
    ok = {
        "fbgemm": fbgemm_supports(spec, device, [128], PoolingType.SUM, [0]) is None,
        "triton": triton_supports(spec, device, [128], PoolingType.SUM, [0]) is None,
        "torch": True,
        "plain": True,
    }
    return [b for b in wanted if ok.get(b, False)]


def embedding_part(device: torch.device, args: argparse.Namespace, copy_bps: float) -> list[dict]:
    from lightrec.kernels import triton_backend

    results = []
    for tables, rows, dim, ids in SMOKE_WORKLOADS if args.smoke else FULL_WORKLOADS:
        w = Workload(tables, rows, dim, ids, args.batch_size)
        batches = _batches(w, device, 4)
        for kind in available_backends(device, args.backends):
            settings = [{}] + (SWEEP if args.sweep and kind == "triton" else [])
            for setting in settings:
                triton_backend.LAUNCH_OVERRIDES.clear()
                triton_backend.LAUNCH_OVERRIDES.update(setting)
                r = time_contender(kind, w, device, batches, args)
                r.update(
                    workload=w.name, tiles=setting or "default", copy_fraction=r["bytes_per_s"] / copy_bps
                )
                results.append(r)
                print(f"  {w.name:32s} {kind:7s} {r['samples_per_s'] / 1e6:8.3f}M samples/s  "
                      f"{r['bytes_per_s'] / 1e9:8.1f} GB/s ({100 * r['copy_fraction']:.0f}% of copy) {setting or ''}",
                      flush=True)  # fmt: skip
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if args.profile and device.type == "cuda" and kind != "plain":
                triton_backend.LAUNCH_OVERRIDES.clear()
                top = kernel_profile(kind, w, device, batches)
                results[-1 - len(settings) + 1]["profile"] = top
                print(f"  kernels of one {kind} iteration ({w.name}):")
                for k in top:
                    print(f"    {k['ms_per_iter']:7.3f} ms {100 * k['share']:4.0f}%  {k['kernel']}")
                torch.cuda.empty_cache()
        triton_backend.LAUNCH_OVERRIDES.clear()
        plain = {r["workload"]: r["samples_per_s"] for r in results if r["contender"] == "plain"}
        for r in results:
            r["x_plain"] = r["samples_per_s"] / plain[r["workload"]] if r["workload"] in plain else None
    return results


def print_tables(report: dict) -> None:
    env = report["environment"]
    print(f"\n{env['device']} | torch {env['torch']} | CUDA {env['cuda']} | triton {env['triton']} | "
          f"fbgemm {env['fbgemm']} | copy {report['copy_bytes_per_s'] / 1e9:.0f} GB/s")  # fmt: skip
    if report.get("embedding"):
        print(
            "\n| workload | contender | samples/s | x plain | GB/s | % of copy | tiles |\n| --- | --- | --- | --- | --- | --- | --- |"
        )
        for r in report["embedding"]:
            x = f"{r['x_plain']:.2f}" if r.get("x_plain") else "-"
            print(f"| {r['workload']} | {r['backend']} | {r['samples_per_s'] / 1e6:.3f}M | {x} | "
                  f"{r['bytes_per_s'] / 1e9:.0f} | {100 * r['copy_fraction']:.0f}% | {r['tiles']} |")  # fmt: skip
    for d in report.get("dlrm") or []:
        print(f"\nDLRM end to end ({d['backend']}, {d['precision']}, batch {d['batch_size']}): "
              f"{d['samples_per_s'] / 1e6:.3f}M samples/s, {d['step_ms']:.2f} ms/step")  # fmt: skip
        print("| stage | ms/step | share |\n| --- | --- | --- |")
        for stage, ms in d["breakdown_ms"].items():
            print(f"| {stage} | {ms:.2f} | {100 * ms / d['step_ms']:.0f}% |")
        if d.get("host_syncs_per_step") is not None:
            print(f"host syncs per measured step: {d['host_syncs_per_step'] or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU too")
    parser.add_argument("--only", choices=["embedding", "dlrm"], default=None)
    parser.add_argument("--backends", default="fbgemm,triton,torch,plain", help="contenders of part (a)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="measured Trainer.fit steps of part (b)")
    parser.add_argument("--sweep", action="store_true", help="also time the Triton backend under other tiles")
    parser.add_argument("--profile", action="store_true",
                        help="GPU only: the CUDA kernels of each fused contender's iteration (torch.profiler)")
    parser.add_argument("--dlrm-backend", default="auto", help="kernel backend of the DLRM's tables")
    parser.add_argument("--dlrm-precision", default="32-true,bf16-mixed",
                        help="Lightning precisions of part (b), comma-separated; each is one run")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.backends = args.backends.split(",")
    args.batch_size = args.batch_size or (256 if args.smoke else 16384)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 5)
    args.iters = args.iters or (3 if args.smoke else 20)
    args.steps = args.steps or (4 if args.smoke else 30)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report: dict[str, Any] = {"environment": environment(device), "args": vars(args)}
    report["copy_bytes_per_s"] = copy_bandwidth(device, (1 << 24) if args.smoke else (1 << 31), args.iters)
    print(json.dumps(report["environment"]), flush=True)
    if args.only in (None, "embedding"):
        report["embedding"] = embedding_part(device, args, report["copy_bytes_per_s"])
    if args.only in (None, "dlrm"):
        from gpu_dlrm import run_dlrm

        report["dlrm"] = [run_dlrm(device, args, precision) for precision in args.dlrm_precision.split(",")]
    print(json.dumps(report, indent=1, default=str))
    print_tables(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
