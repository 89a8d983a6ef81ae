"""Single-process embedding training throughput: fwd + bwd + update, one thread.

Configuration (issue 3 / DESIGN.md): 26 tables x 100k rows x dim 64, batch 2048, one id per feature,
SGD, ``torch.set_num_threads(1)``. Every contender runs in the SAME process on the same batches:

* ``lightrec_fused_<backend>``: ``lightrec.kernels.FusedEmbeddingBagCollection`` (SGD fused into
  backward) for each available backend (``torch`` always, ``fbgemm`` when importable);
  ``lightrec_fused_torch_stock_update``: the torch kernel with its stock-op update (the fallback
  where the native CPU update cannot be built);
* ``torch_unsharded_ebc_sgd``: one ``nn.EmbeddingBag`` per table + ``torch.optim.SGD``, which is
  what torchrec's unsharded ``EmbeddingBagCollection`` does (dense [rows, D] gradients);
* ``lightrec_unsharded_ebc_sgd``: ``lightrec.modules.EmbeddingBagCollection`` + ``torch.optim.SGD``;
* ``torchrec_unsharded_ebc_sgd``: torchrec's own ``EmbeddingBagCollection`` + SGD, when the
  ``torchrec`` package imports (it is never a lightrec dependency; put it on PYTHONPATH);
* ``torchrec_dmp_fused_1rank``: torchrec's fused path, ``DistributedModelParallel`` on a one-rank
  gloo group with ``EXACT_SGD`` fused into its TBE (torchrec's answer to the same problem).

Run::

    /work/venv/bin/python benchmarks/bench_embedding.py --out bench_embedding.json
    PYTHONPATH=/work/benchdeps /work/venv/bin/python benchmarks/bench_embedding.py --out ...  # + torchrec

Prints samples/s per contender and ratios against ``torch_unsharded_ebc_sgd``; writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from collections.abc import Callable

import torch

from lightrec._fbgemm import fbgemm_available, fbgemm_unavailable_reason
from lightrec.kernels import FusedEmbeddingBagCollection
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor

BASELINE = "torch_unsharded_ebc_sgd"


def make_tables(num_tables: int, rows: int, dim: int) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name=f"t{i}", feature_names=[f"f{i}"])
        for i in range(num_tables)
    ]


def make_batches(num: int, num_tables: int, rows: int, batch: int, seed: int = 0) -> list[KeyedJaggedTensor]:
    gen = torch.Generator().manual_seed(seed)
    keys = [f"f{i}" for i in range(num_tables)]
    return [
        KeyedJaggedTensor(
            keys=keys,
            values=torch.randint(0, rows, (num_tables * batch,), generator=gen),
            lengths=torch.ones(num_tables * batch, dtype=torch.long),
        )
        for _ in range(num)
    ]


class TorchUnshardedEBC(torch.nn.Module):
    """One ``nn.EmbeddingBag`` per table: torchrec's unsharded EmbeddingBagCollection, in plain torch."""

    def __init__(self, tables: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode="sum", include_last_offset=True)
            for t in tables
        )

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        outs = []
        for bag, jt in zip(self.bags, kjt.to_dict().values(), strict=True):
            outs.append(bag(jt.values(), jt.offsets()))
        return torch.cat(outs, dim=1)


def time_steps(
    step: Callable[[KeyedJaggedTensor], None], batches: list[KeyedJaggedTensor], warmup: int, iters: int
) -> float:
    """Seconds per step (median of per-step wall times after ``warmup`` steps)."""
    for i in range(warmup):
        step(batches[i % len(batches)])
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def contenders(tables: list[EmbeddingBagConfig], lr: float) -> dict[str, Callable[[], Callable | str]]:
    """name -> builder returning a step function (or a string: why it is skipped)."""

    def fused(backend: str, stock_update: bool = False) -> Callable[[], Callable | str]:
        def build() -> Callable | str:
            if backend == "fbgemm" and not fbgemm_available():
                return f"fbgemm unavailable: {fbgemm_unavailable_reason()}"
            if stock_update:  # the torch kernel's update as stock torch ops (its fallback)
                os.environ["LIGHTREC_CPU_UPDATE_NATIVE"] = "0"
            try:
                ebc = FusedEmbeddingBagCollection(tables, torch.optim.SGD, {"lr": lr}, kernel_backend=backend)
            finally:
                os.environ.pop("LIGHTREC_CPU_UPDATE_NATIVE", None)

            def step(kjt: KeyedJaggedTensor) -> None:
                ebc(kjt).values().sum().backward()  # rows updated inside backward; no optimizer.step()

            return step

        return build

    def dense(make_module: Callable[[], torch.nn.Module], values: Callable) -> Callable[[], Callable | str]:
        def build() -> Callable | str:
            try:
                module = make_module()
            except ImportError as exc:
                return f"not importable: {exc}"
            opt = torch.optim.SGD(module.parameters(), lr=lr)

            def step(kjt: KeyedJaggedTensor) -> None:
                opt.zero_grad()
                values(module(kjt)).sum().backward()
                opt.step()

            return step

        return build

    def torchrec_ebc() -> torch.nn.Module:
        import torchrec  # noqa: PLC0415  (optional baseline, never a lightrec dependency)

        configs = [
            torchrec.EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.embedding_dim,
                num_embeddings=t.num_embeddings,
                feature_names=t.feature_names,
            )
            for t in tables
        ]
        module = torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
        return _TorchrecAdapter(module, torchrec)

    def torchrec_dmp() -> Callable | str:
        """torchrec's fused path: DistributedModelParallel on a 1-rank gloo group, EXACT_SGD fused in TBE."""
        try:
            import torchrec  # noqa: PLC0415
            from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: PLC0415
            from torchrec.distributed import DistributedModelParallel  # noqa: PLC0415
            from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: PLC0415
        except ImportError as exc:
            return f"not importable: {exc}"
        import os  # noqa: PLC0415

        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29541")
            dist.init_process_group("gloo", rank=0, world_size=1)
        configs = [
            torchrec.EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.embedding_dim,
                num_embeddings=t.num_embeddings,
                feature_names=t.feature_names,
            )
            for t in tables
        ]
        ebc = torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        sharder = EmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}
        )
        model = DistributedModelParallel(ebc, device=torch.device("cpu"), sharders=[sharder])

        def step(kjt: KeyedJaggedTensor) -> None:
            tr_kjt = torchrec.KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths())
            model(tr_kjt).values().sum().backward()

        return step

    return {
        "lightrec_fused_torch": fused("torch"),
        "lightrec_fused_torch_stock_update": fused("torch", stock_update=True),
        "lightrec_fused_fbgemm": fused("fbgemm"),
        BASELINE: dense(lambda: TorchUnshardedEBC(tables), lambda out: out),
        "lightrec_unsharded_ebc_sgd": dense(lambda: EmbeddingBagCollection(tables), lambda kt: kt.values()),
        "torchrec_unsharded_ebc_sgd": dense(torchrec_ebc, lambda out: out),
        "torchrec_dmp_fused_1rank": torchrec_dmp,
    }


class _TorchrecAdapter(torch.nn.Module):
    """Feeds torchrec's EBC a torchrec KJT built from ours (same values/lengths)."""

    def __init__(self, ebc: torch.nn.Module, torchrec: object) -> None:
        super().__init__()
        self.ebc, self._torchrec = ebc, torchrec

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        tr_kjt = self._torchrec.KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths())
        return self.ebc(tr_kjt).values()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--only", nargs="*", help="run only these contenders")
    parser.add_argument("--out", help="write results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    tables = make_tables(args.tables, args.rows, args.dim)
    batches = make_batches(4, args.tables, args.rows, args.batch)
    results: dict[str, dict] = {}
    for name, build in contenders(tables, args.lr).items():
        if args.only and name not in args.only:
            continue
        step = build()
        if isinstance(step, str):
            results[name] = {"skipped": step}
            print(f"{name:30s} skipped: {step}")
            continue
        sec = time_steps(step, batches, args.warmup, args.iters)
        results[name] = {"ms_per_step": sec * 1e3, "samples_per_s": args.batch / sec}
        print(f"{name:30s} {sec * 1e3:9.1f} ms/step {args.batch / sec:12,.0f} samples/s", flush=True)
        del step
        gc.collect()
    base = results.get(BASELINE, {}).get("samples_per_s")
    if base:
        for name, r in results.items():
            if "samples_per_s" in r:
                r["ratio_vs_torch_unsharded"] = r["samples_per_s"] / base
                print(f"{name:30s} {r['ratio_vs_torch_unsharded']:6.2f}x {BASELINE}")
        tr = results.get("torchrec_unsharded_ebc_sgd", {}).get("samples_per_s")
        if tr:
            for name, r in results.items():
                if "samples_per_s" in r:
                    r["ratio_vs_torchrec_unsharded"] = r["samples_per_s"] / tr
                    print(f"{name:30s} {r['ratio_vs_torchrec_unsharded']:6.2f}x torchrec_unsharded_ebc_sgd")
    report = {
        "config": vars(args) | {"threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "fbgemm_available": fbgemm_available(),
        "machine": platform.platform(),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
