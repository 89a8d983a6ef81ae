"""Raw 64-bit ids that drift: progressive AUC and step time of three ways to give ids rows.

The stream (built here, no data to download): ``--tables`` features, one id per sample each.
Every feature has a vocabulary that drifts -- ids are born at a steady rate and live for a while,
so that about ``--vocab-factor`` (10) times more distinct ids than a table has rows pass through
it -- and each id is a 64-bit hash of its birth number, made non-negative (an int64 in
``[0, 2**63 - 1)``, torchrec's default ``input_hash_size``). Ids are drawn by a popularity that is a
property of the id (heavy-tailed, Pareto), and the label is planted: ``logit = bias + sum_t effect_t(id_t)``
with per-id effects from a hash. A model sees each batch before it trains on it, so the AUC of
its predictions over the run (after a warm-up) is its *progressive* AUC.

Contenders (same model -- concatenated embeddings, one hidden layer -- same optimizers: fused
row-wise Adagrad for the tables, Adagrad for the dense layers, same batches):

* ``modulo``: a table of ``--rows`` rows, id ``% rows`` (live ids share rows, new ids inherit);
  its step is the *plain collection's step* the step-time target is measured against;
* ``managed``: lightrec's ``ManagedCollisionEmbeddingBagCollection`` with ``--rows`` rows (MCH, LRU,
  eviction round every ``--eviction-interval`` steps, rows for new ids at once, evicted rows reset);
* ``managed_round_only``: the same with ``immediate_eviction_fraction=0`` -- new ids wait in the
  default row until the next round, as torchrec's module does (an ablation);
* ``row_per_id``: a table with a row for every id the run will ever see (the quality ceiling);
* ``torchrec_managed``: torchrec's managed collisions (MCH, LRU, eviction every 2 steps, its
  unsharded ``EmbeddingBagCollection`` and dense Adagrad), only when ``torchrec`` imports (it is
  never installed into lightrec's environment; put it on PYTHONPATH).

The contenders advance together, one step each in turn, so they share the machine's state; step
time is the median over the run of the CPU time of the (single) thread that runs the step, so that
other processes on a shared machine do not inflate it. Targets (issue 25): managed AUC within 0.01 of
``row_per_id``; managed step at most 1.5x ``modulo``'s. torchrec measured on this machine (issue
25): AUC 0.8036 modulo, 0.8146 torchrec managed, 0.8532 row per id; step 6.2 ms vs 1.8 ms.

Run::

    python benchmarks/bench_managed_collisions.py --out bench_managed_collisions.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lightrec.data.hashing import exact_auc, hash_uniform, hash_unit, mix64
from lightrec.kernels import FusedEmbeddingBagCollection
from lightrec.modules import EmbeddingBagConfig
from lightrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from lightrec.modules.mc_modules import (
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from lightrec.sparse import KeyedJaggedTensor

INPUT_HASH_SIZE = 2**63 - 1  # torchrec's default: raw ids fill the non-negative int64 range


class DriftingStream:
    """Batches of a drifting 64-bit id vocabulary with planted labels (see the module docstring).

    Args:
        tables / rows / batch / steps: features, rows per managed table, samples per step, steps.
        vocab_factor: distinct ids per feature over the run, in table rows.
        window: ids alive at once, as a share of the rows.
        signal: standard deviation of each feature's effect on the logit.
        seed: fixes everything.
    """

    def __init__(self, tables: int, rows: int, batch: int, steps: int, vocab_factor: float, window: float,
                 signal: float, seed: int) -> None:  # fmt: skip
        self.tables, self.rows, self.batch, self.steps, self.seed = tables, rows, batch, steps, seed
        self.window = int(window * rows)
        self.total = int(vocab_factor * rows)
        self.rate = (self.total - self.window) / max(steps - 1, 1)  # births per step
        self.signal = signal
        self.bias = -1.0

    def raw_ids(self, table: int, births: np.ndarray) -> np.ndarray:
        """The raw id of each birth number: its 64-bit hash with the sign bit cleared (int64 in
        ``[0, INPUT_HASH_SIZE)``)."""
        salted = births.astype(np.uint64) + np.uint64((self.seed * 131 + table) << 40)
        return np.minimum(mix64(salted) >> np.uint64(1), np.uint64(INPUT_HASH_SIZE - 1)).astype(np.int64)

    def step(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(raw ids [T, B], birth numbers [T, B], labels [B])`` of step ``s``."""
        rng = np.random.default_rng([self.seed, s])
        start = int(s * self.rate)
        alive = np.arange(start, start + self.window, dtype=np.int64)
        births = np.empty((self.tables, self.batch), dtype=np.int64)
        raw = np.empty_like(births)
        logit = np.full(self.batch, self.bias)
        for t in range(self.tables):
            # popularity: heavy-tailed (Pareto, shape 1.5), a property of the id (hash of its birth number)
            weight = (1.0 - hash_uniform(alive, self.seed, 100 + t)) ** (-1.0 / 1.5)
            cdf = np.cumsum(weight)
            births[t] = alive[np.searchsorted(cdf, rng.random(self.batch) * cdf[-1])]
            raw[t] = self.raw_ids(t, births[t])
            logit += self.signal * hash_unit(raw[t], self.seed, 200 + t)
        labels = (rng.random(self.batch) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return raw, births, labels


@dataclass
class Contender:
    """One way of turning raw ids into rows, with its model and what it measured."""

    name: str
    ids: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (raw [T, B], births [T, B]) -> ids fed to `embed`
    embed: nn.Module
    dense: nn.Module
    optimizer: torch.optim.Optimizer
    pooled: Callable[[Any], torch.Tensor]
    scores: list[np.ndarray] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def _dense_model(tables: int, dim: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(tables * dim, 64), nn.ReLU(), nn.Linear(64, 1))


def _configs(tables: int, rows: int, dim: int) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name=f"t{t}", feature_names=[f"f{t}"],
                               weight_init_max=0.01, weight_init_min=-0.01) for t in range(tables)]  # fmt: skip


def _fused(configs: list[EmbeddingBagConfig], args: argparse.Namespace) -> FusedEmbeddingBagCollection:
    return FusedEmbeddingBagCollection(configs, fused_params={"optimizer": "ROWWISE_ADAGRAD", "learning_rate": args.lr},
                                       kernel_backend=args.backend)  # fmt: skip


def _lightrec_contenders(args: argparse.Namespace, stream: DriftingStream) -> list[Contender]:
    out = []
    dims = (args.tables, args.dim)

    def add(name: str, ids: Callable[[np.ndarray, np.ndarray], np.ndarray], embed: nn.Module,
            pooled: Callable[[Any], torch.Tensor]) -> None:  # fmt: skip
        dense = _dense_model(*dims, args.seed)
        out.append(Contender(name, ids, embed, dense, torch.optim.Adagrad(dense.parameters(), lr=args.dense_lr), pooled))

    rows = args.rows
    add("modulo", lambda raw, births: raw % rows, _fused(_configs(args.tables, rows, args.dim), args), lambda o: o.values())
    for name, fraction in (("managed", 0.25), ("managed_round_only", 0.0)):
        configs = _configs(args.tables, rows, args.dim)
        modules = {
            c.name: MCHManagedCollisionModule(rows, "cpu", LRU_EvictionPolicy(), args.eviction_interval,
                                              input_hash_size=INPUT_HASH_SIZE, immediate_eviction_fraction=fraction)
            for c in configs
        }  # fmt: skip
        mc = ManagedCollisionEmbeddingBagCollection(_fused(configs, args), ManagedCollisionCollection(modules, configs))
        add(name, lambda raw, births: raw, mc, lambda o: o[0].values())
    ceiling = stream.total + stream.window + 1
    add("row_per_id", lambda raw, births: births, _fused(_configs(args.tables, ceiling, args.dim), args),
        lambda o: o.values())  # fmt: skip
    return out


def _torchrec_contender(args: argparse.Namespace) -> Contender | None:  # pragma: no cover - needs torchrec
    try:
        from torchrec import EmbeddingBagCollection as TrEBC
        from torchrec import EmbeddingBagConfig as TrConfig
        from torchrec import KeyedJaggedTensor as TrKJT
        from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection as TrMC
        from torchrec.modules.mc_modules import LRU_EvictionPolicy as TrLRU
        from torchrec.modules.mc_modules import ManagedCollisionCollection as TrMCC
        from torchrec.modules.mc_modules import MCHManagedCollisionModule as TrMCH
    except ImportError:
        return None
    configs = [TrConfig(num_embeddings=args.rows, embedding_dim=args.dim, name=f"t{t}", feature_names=[f"f{t}"])
               for t in range(args.tables)]  # fmt: skip
    modules = {c.name: TrMCH(zch_size=args.rows, device=torch.device("cpu"), eviction_policy=TrLRU(),
                             eviction_interval=2, input_hash_size=INPUT_HASH_SIZE) for c in configs}  # fmt: skip
    embed = TrMC(TrEBC(tables=configs, device=torch.device("cpu")), TrMCC(modules, configs))
    dense = _dense_model(args.tables, args.dim, args.seed)
    params = list(embed.parameters()) + list(dense.parameters())
    contender = Contender("torchrec_managed", lambda raw, births: raw, embed, dense,
                          torch.optim.Adagrad(params, lr=args.dense_lr), lambda o: o[0].values())  # fmt: skip
    contender.kjt_class = TrKJT  # type: ignore[attr-defined]
    return contender


def _kjt(contender: Contender, ids: np.ndarray, keys: list[str]) -> Any:
    cls = getattr(contender, "kjt_class", KeyedJaggedTensor)
    values = torch.from_numpy(np.ascontiguousarray(ids).reshape(-1))
    return cls(keys=keys, values=values, lengths=torch.ones(values.numel(), dtype=torch.int64))


def _step(contender: Contender, kjt: Any, labels: torch.Tensor) -> np.ndarray:
    logits = contender.dense(contender.pooled(contender.embed(kjt))).squeeze(1)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
    contender.optimizer.zero_grad()
    loss.backward()
    contender.optimizer.step()
    return torch.sigmoid(logits.detach()).numpy()


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    stream = DriftingStream(args.tables, args.rows, args.batch, args.steps, args.vocab_factor, args.window,
                            args.signal, args.seed)  # fmt: skip
    contenders = _lightrec_contenders(args, stream)
    theirs = _torchrec_contender(args)
    if theirs is not None:
        contenders.append(theirs)
    keys = [f"f{t}" for t in range(args.tables)]
    labels_all, warmup = [], int(args.warmup * args.steps)
    for s in range(args.steps):
        raw, births, labels = stream.step(s)
        label_t = torch.from_numpy(labels)
        for c in contenders:
            kjt = _kjt(c, c.ids(raw, births), keys)
            start = time.thread_time()  # CPU time of this thread: other processes' load does not count
            scores = _step(c, kjt, label_t)
            c.seconds.append(time.thread_time() - start)
            if s >= warmup:
                c.scores.append(scores)
        if s >= warmup:
            labels_all.append(labels)
    labels_cat = np.concatenate(labels_all)
    results: dict[str, Any] = {}
    for c in contenders:
        timed = c.seconds[warmup:] if args.steps - warmup > 10 else c.seconds
        results[c.name] = {"progressive_auc": exact_auc(np.concatenate(c.scores), labels_cat),
                           "step_ms": 1e3 * statistics.median(timed)}  # fmt: skip
    distinct = stream.total
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"} | {"distinct_ids_per_table": distinct,
                                                                          "ids_alive_at_once": stream.window},
        "results": results,
        "torchrec": "measured" if theirs is not None else "not importable (issue 25 on this machine: AUC 0.8036 "
                    "modulo, 0.8146 torchrec managed, 0.8532 row per id; step 6.2 ms vs 1.8 ms)",
        "platform": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()},
    }  # fmt: skip


def _report(out: dict[str, Any]) -> None:
    res = out["results"]
    base, ceiling = res["modulo"]["step_ms"], res["row_per_id"]["progressive_auc"]
    print(f"{'contender':<22} {'prog. AUC':>9} {'vs row/id':>9} {'step ms':>8} {'vs modulo':>9}")
    for name, r in res.items():
        print(f"{name:<22} {r['progressive_auc']:>9.4f} {r['progressive_auc'] - ceiling:>+9.4f} "
              f"{r['step_ms']:>8.2f} {r['step_ms'] / base:>8.2f}x")  # fmt: skip
    managed = res["managed"]
    print(f"target AUC within 0.01 of row_per_id: {'met' if ceiling - managed['progressive_auc'] <= 0.01 else 'MISSED'}; "
          f"target step <= 1.5x modulo: {'met' if managed['step_ms'] <= 1.5 * base else 'MISSED'}")  # fmt: skip
    print(f"torchrec: {out['torchrec']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--rows", type=int, default=10_000, help="rows of each managed (and modulo) table")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--vocab-factor", type=float, default=10.0, help="distinct ids per table over the run, in rows")
    parser.add_argument("--window", type=float, default=0.5, help="ids alive at once, as a share of the rows")
    parser.add_argument("--signal", type=float, default=0.8, help="std of each feature's effect on the logit")
    parser.add_argument("--eviction-interval", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05, help="fused row-wise Adagrad of the tables")
    parser.add_argument("--dense-lr", type=float, default=0.01)
    parser.add_argument("--backend", default="auto", help="kernel backend of the fused tables")
    parser.add_argument("--warmup", type=float, default=0.1, help="share of steps left out of the AUC")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    out = run(args)
    _report(out)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
