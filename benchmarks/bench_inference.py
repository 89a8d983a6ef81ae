"""Quantized embedding inference: forward throughput and model size, fp32 vs int8 vs int4.

Configuration (issue 7): 26 tables x 100k rows x dim 64 (one feature each), batch 2048,
``--pooling-factor`` ids per bag (default 1, Criteo-like), ``torch.set_num_threads(1)``. Every
contender runs in the SAME process on the same pre-generated batches:

* ``fp32_ebc``: ``lightrec.EmbeddingBagCollection`` (float tables; the baseline);
* ``<dtype>_qebc_<kernel>``: ``lightrec.inference.QuantEmbeddingBagCollection`` with int8 / int4
  tables, on fbgemm's IntN kernel (one op call per table) and on the pure-torch kernel;
* ``<dtype>_sharded_tbe``: the same tables after ``shard_for_inference`` (one fbgemm
  ``IntNBitTableBatchedEmbeddingBagsCodegen`` for all 26 tables, one kernel call per batch);
* ``torchrec_<dtype>_qebc``: torchrec's quantized EBC, when ``import torchrec`` works (it is not a
  lightrec dependency; put torchrec 1.8.0 on PYTHONPATH to compare), otherwise reported as skipped.

Run::

    python benchmarks/bench_inference.py                 # JSON to stdout
    python benchmarks/bench_inference.py --out inference.json --iters 20 --pooling-factor 4
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def _batches(num_tables: int, rows: int, batch: int, pooling: int, count: int, seed: int) -> list[Any]:
    from lightrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    keys = [f"f{i}" for i in range(num_tables)]
    out = []
    for _ in range(count):
        lengths = torch.full((num_tables * batch,), pooling, dtype=torch.int64)
        values = torch.randint(0, rows, (num_tables * batch * pooling,), generator=g)
        out.append(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
    return out


def _time(fn: Callable[[Any], Any], batches: list[Any], iters: int, warmup: int = 2) -> float:
    """Median seconds per forward over ``iters`` calls (cycling through ``batches``)."""
    with torch.no_grad():
        for i in range(warmup):
            fn(batches[i % len(batches)])
        times = []
        for i in range(iters):
            start = time.perf_counter()
            fn(batches[i % len(batches)])
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def _torchrec_contenders(ebc_float: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    try:
        import torchrec  # noqa: F401
        from torchrec.modules.embedding_configs import QuantConfig
        from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchrecQEBC
    except Exception as exc:  # not installed (the usual case), or a broken install
        print(f"torchrec is not importable ({type(exc).__name__}: {exc}); skipping its quantized EBC",
              file=sys.stderr)
        return {"skipped": f"torchrec not importable: {type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {}
    from torch import quantization as quant

    tables = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings,
                                          embedding_dim=t.embedding_dim, feature_names=t.feature_names)
              for t in ebc_float.embedding_bag_configs()]
    tr_ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    tr_ebc.load_state_dict(ebc_float.state_dict())
    batches = [torchrec.KeyedJaggedTensor(keys=b.keys(), values=b.values(), lengths=b.lengths())
               for b in _batches(args.tables, args.rows, args.batch, args.pooling_factor, 3, 1)]
    for dtype_name, dtype in (("int8", torch.qint8), ("int4", torch.quint4x2)):
        qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=quant.PlaceholderObserver.with_args(dtype=dtype))
        holder = torch.nn.Sequential(tr_ebc)
        q = quant.quantize_dynamic(holder, qconfig_spec={torchrec.EmbeddingBagCollection: qconfig},
                                   mapping={torchrec.EmbeddingBagCollection: TorchrecQEBC}, inplace=False)[0]
        seconds = _time(lambda b, q=q: q(b), batches, args.iters)
        out[f"torchrec_{dtype_name}_qebc"] = {"seconds_per_batch": seconds, "samples_per_s": args.batch / seconds}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pooling-factor", type=int, default=1)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--torch-kernel-iters", type=int, default=5, help="iterations for the (slower) pure-torch kernel")
    parser.add_argument("--out", default=None, help="write the JSON here as well as to stdout")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import lightrec
    from lightrec._fbgemm import fbgemm_available
    from lightrec.inference import QuantEmbeddingBagCollection, shard_for_inference

    torch.manual_seed(0)
    tables = [lightrec.EmbeddingBagConfig(name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim,
                                          feature_names=[f"f{i}"]) for i in range(args.tables)]
    ebc = lightrec.EmbeddingBagCollection(tables)
    batches = _batches(args.tables, args.rows, args.batch, args.pooling_factor, 3, 1)
    results: dict[str, Any] = {}

    def record(name: str, fn: Callable[[Any], Any], size_bytes: int, iters: int, reference: torch.Tensor | None) -> None:
        seconds = _time(fn, batches, iters)
        entry = {"seconds_per_batch": seconds, "samples_per_s": args.batch / seconds, "table_bytes": size_bytes}
        if reference is not None:
            with torch.no_grad():
                entry["max_abs_err_vs_fp32"] = float((fn(batches[0]).values() - reference).abs().max())
        results[name] = entry
        print(f"{name:28s} {entry['samples_per_s']:>12,.0f} samples/s  {size_bytes / 2**20:8.1f} MiB", file=sys.stderr)

    fp32_bytes = sum(p.numel() * p.element_size() for p in ebc.parameters())
    with torch.no_grad():
        reference = ebc(batches[0]).values()
    record("fp32_ebc", lambda b: ebc(b), fp32_bytes, args.iters, None)
    kernels = [("fbgemm", True)] if fbgemm_available() else []
    kernels.append(("torch", False))
    for dtype in ("int8", "int4"):
        for kernel, use_fbgemm in kernels:
            q = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, use_fbgemm=use_fbgemm)
            iters = args.iters if use_fbgemm else args.torch_kernel_iters
            record(f"{dtype}_qebc_{kernel}", lambda b, q=q: q(b), q.storage_bytes(), iters, reference)
            if use_fbgemm:
                sharded = shard_for_inference(q, devices=1, inplace=True)
                size = sum(m.weights_host.numel() for m in sharded.modules() if hasattr(m, "weights_host"))
                record(f"{dtype}_sharded_tbe", lambda b, s=sharded: s(b), size, args.iters, reference)
            del q
    results.update(_torchrec_contenders(ebc, args))
    report = {
        "benchmark": "quantized EmbeddingBagCollection forward",
        "config": vars(args) | {"threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__, "lightrec": lightrec.__version__, "python": platform.python_version(),
                     "fbgemm_available": fbgemm_available()},
        "machine": platform.platform(),
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
