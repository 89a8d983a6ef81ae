"""Quantized embedding inference: forward throughput and model size, fp32 vs int8 vs int4.

Configuration (issue 7): 26 tables x 100k rows x dim 64 (one feature each), batch 2048,
``--pooling-factor`` ids per bag (default 1, Criteo-like), ``torch.set_num_threads(1)``. Every
contender runs in the SAME process on the same pre-generated batches:

* ``fp32_ebc``: ``lightrec.EmbeddingBagCollection`` (float tables; the baseline);
* ``<dtype>_qebc_<kernel>``: ``lightrec.inference.QuantEmbeddingBagCollection`` with int8 / int4
  tables, on fbgemm's IntN kernel (all 26 tables in one op call, from one flat buffer) and on the
  pure-torch kernel;
* ``<dtype>_sharded_tbe``: the same tables after ``shard_for_inference`` (one fbgemm
  ``IntNBitTableBatchedEmbeddingBagsCodegen`` for all 26 tables, one kernel call per batch);
* ``torchrec_<dtype>_qebc``: torchrec's quantized EBC, when ``import torchrec`` works (it is not a
  lightrec dependency; put torchrec 1.8.0 on PYTHONPATH to compare), otherwise reported as skipped.

Each timed call builds the ``KeyedJaggedTensor`` from raw request tensors and runs the forward.
Contenders are timed round-robin (each round runs every contender a few times) so that load on a
shared machine hits all of them alike; the median and the fastest-decile forward times are
reported (the latter is what a quiet machine gives), with table memory, the largest error against
fp32 and, for torchrec, the largest difference from lightrec's output (its quantizer rounds a few
scales differently).

Run::

    python benchmarks/bench_inference.py                 # JSON to stdout, a summary on stderr
    python benchmarks/bench_inference.py --out inference.json --rounds 10 --pooling-factor 4
    # torchrec baseline, installed beside (never over) torch and fbgemm:
    pip install --no-deps --target /work/benchdeps torchrec==1.8.0 iopath portalocker tensordict pyvers \
        pyre-extensions typing-inspect mypy-extensions orjson cloudpickle
    PYTHONPATH=/work/benchdeps python benchmarks/bench_inference.py
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


def _requests(args: argparse.Namespace) -> list[tuple[list[str], torch.Tensor, torch.Tensor]]:
    """The batches as raw request tensors ``(keys, values, lengths)``: every contender builds its own
    ``KeyedJaggedTensor`` inside the timed call, as a server does per request (so no contender
    profits from offsets cached on a reused batch)."""
    return [(b.keys(), b.values(), b.lengths())
            for b in _batches(args.tables, args.rows, args.batch, args.pooling_factor, 3, 1)]


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


class _Contender:
    """One forward to time: ``fn(batch) -> output tensor [B, sum D]`` plus what to report beside its speed."""

    def __init__(self, name: str, fn: Callable[[Any], torch.Tensor], table_bytes: int, batches: list[Any],
                 iters_per_round: int) -> None:
        self.name = name
        self.fn = fn
        self.table_bytes = table_bytes
        self.batches = batches
        self.iters_per_round = iters_per_round
        self.times: list[float] = []

    def run(self, iters: int) -> None:
        with torch.no_grad():
            for i in range(iters):
                batch = self.batches[(len(self.times) + i) % len(self.batches)]
                start = time.perf_counter()
                self.fn(batch)
                self.times.append(time.perf_counter() - start)

    def percentile(self, q: float) -> float:
        times = sorted(self.times)
        return times[min(len(times) - 1, int(q * len(times)))]


def _time_interleaved(contenders: list[_Contender], rounds: int) -> None:
    """Round-robin: every round runs each contender a few times, so load spikes on a shared machine
    hit all of them alike instead of whichever happened to be running (medians are reported)."""
    for c in contenders:
        c.run(2)  # warm-up
        c.times.clear()
    for _ in range(rounds):
        for c in contenders:
            c.run(c.iters_per_round)


def _torchrec_contenders(ebc_float: torch.nn.Module, args: argparse.Namespace) -> tuple[list[_Contender], str | None]:
    try:
        import torchrec  # noqa: F401
        from torchrec.modules.embedding_configs import QuantConfig
        from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchrecQEBC
    except Exception as exc:  # not installed (the usual case), or a broken install
        print(f"torchrec is not importable ({type(exc).__name__}: {exc}); skipping its quantized EBC",
              file=sys.stderr)
        return [], f"torchrec not importable: {type(exc).__name__}: {exc}"
    from torch import quantization as quant

    tables = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings,
                                          embedding_dim=t.embedding_dim, feature_names=t.feature_names)
              for t in ebc_float.embedding_bag_configs()]
    tr_ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    tr_ebc.load_state_dict(ebc_float.state_dict())
    requests = _requests(args)
    out = []
    for dtype_name, dtype in (("int8", torch.qint8), ("int4", torch.quint4x2)):
        qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=quant.PlaceholderObserver.with_args(dtype=dtype))
        q = quant.quantize_dynamic(torch.nn.Sequential(tr_ebc), qconfig_spec={torchrec.EmbeddingBagCollection: qconfig},
                                   mapping={torchrec.EmbeddingBagCollection: TorchrecQEBC}, inplace=False)[0]
        # the bytes its TBE kernels hold (its state_dict shows int4 tables as [rows, 2 x row bytes] views)
        size = sum(int(getattr(m, attr).numel()) for m in q._emb_modules
                   for attr in ("weights_host", "weights_dev", "weights_uvm"))
        out.append(_Contender(f"torchrec_{dtype_name}_qebc",
                              lambda r, q=q: q(torchrec.KeyedJaggedTensor(keys=r[0], values=r[1], lengths=r[2])).values(),
                              size, requests, 5))
    del tr_ebc
    return out, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pooling-factor", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6, help="round-robin rounds (5 forwards per contender each)")
    parser.add_argument("--no-torch-kernel", action="store_true", help="skip the (slow) pure-torch kernel")
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
    requests = _requests(args)

    def lightrec_fn(module: torch.nn.Module) -> Callable[[Any], torch.Tensor]:
        return lambda r: module(lightrec.KeyedJaggedTensor(keys=r[0], values=r[1], lengths=r[2])).values()

    contenders = [_Contender("fp32_ebc", lightrec_fn(ebc), sum(p.numel() * p.element_size() for p in ebc.parameters()),
                             requests, 5)]
    kernels = [("fbgemm", True)] if fbgemm_available() else []
    if not args.no_torch_kernel:
        kernels.append(("torch", False))
    for dtype in ("int8", "int4"):
        for kernel, use_fbgemm in kernels:
            q = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, kernel_backend=kernel)
            contenders.append(_Contender(f"{dtype}_qebc_{kernel}", lightrec_fn(q), q.storage_bytes(), requests,
                                         5 if use_fbgemm else 1))
            if use_fbgemm:
                sharded = shard_for_inference(q, devices=1)
                size = sum(m.weights_host.numel() for m in sharded.modules() if hasattr(m, "weights_host"))
                contenders.append(_Contender(f"{dtype}_sharded_tbe", lightrec_fn(sharded), size, requests, 5))
    theirs, skipped = _torchrec_contenders(ebc, args)
    contenders += theirs
    with torch.no_grad():
        outputs = {c.name: c.fn(c.batches[0]) for c in contenders}
        reference = outputs["fp32_ebc"]
    _time_interleaved(contenders, args.rounds)

    results: dict[str, Any] = {}
    for c in contenders:
        seconds, fast = c.percentile(0.5), c.percentile(0.1)
        entry: dict[str, Any] = {"seconds_per_batch": seconds, "samples_per_s": args.batch / seconds,
                                 "samples_per_s_p10": args.batch / fast, "table_bytes": c.table_bytes,
                                 "forwards_timed": len(c.times)}
        if c.name != "fp32_ebc":
            entry["max_abs_err_vs_fp32"] = float((outputs[c.name] - reference).abs().max())
        dtype = c.name.split("_")[1] if c.name.startswith("torchrec") else c.name.split("_")[0]
        if c.name.startswith("torchrec") and f"{dtype}_qebc_fbgemm" in outputs:
            entry[f"max_abs_diff_vs_lightrec_{dtype}"] = float((outputs[c.name] - outputs[f"{dtype}_qebc_fbgemm"]).abs().max())
        results[c.name] = entry
        print(f"{c.name:22s} {entry['samples_per_s']:>10,.0f} samples/s (median)  {entry['samples_per_s_p10']:>10,.0f} "
              f"(fastest decile)  {c.table_bytes / 2**20:7.1f} MiB", file=sys.stderr)
    for dtype in ("int8", "int4"):
        mine, theirs_name = results.get(f"{dtype}_qebc_fbgemm"), results.get(f"torchrec_{dtype}_qebc")
        if mine and theirs_name:
            ratio = mine["samples_per_s"] / theirs_name["samples_per_s"]
            ratio_fast = mine["samples_per_s_p10"] / theirs_name["samples_per_s_p10"]
            results[f"ratio_{dtype}_lightrec_over_torchrec"] = {"median": ratio, "fastest_decile": ratio_fast}
            print(f"{dtype}: lightrec / torchrec = {ratio:.2f}x (median), {ratio_fast:.2f}x (fastest decile)",
                  file=sys.stderr)
    if skipped:
        results["torchrec"] = {"skipped": skipped}
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
