"""What freshness buys: a serving copy refreshed by whole-model copies or by published deltas, on drifting ids.

The analogue of the Monolith paper's sync-interval table. A managed-collision model trains online on
a drifting stream of raw 62-bit ids (``bench_managed_collisions.DriftingStream``: ``--tables``
features, one id per sample each, ``--vocab-factor`` times more distinct ids than a table has rows
passing through it over the run, labels planted on the ids). Over the second half of the stream,
each batch is scored *before the trainer trains on it* by

* **(c) the trainer** itself: the training step's own forward (progressive validation);
* **(a) whole-model copies**: a served artifact refreshed every ``N`` steps with everything -- a
  snapshot (every row of every table, its raw ids, the dense weights) published with
  ``publish_snapshot`` and applied by the serving side's ``DeltaFollower``; ``N`` = 1, 10, 50, and
  *never* (the copy taken at the start of the second half, frozen);
* **(b) deltas**: a served artifact refreshed every ``N`` steps with only the rows touched since
  its last refresh (looked up, or reset by an eviction) and the dense weights, published with
  ``publish_rows`` and applied by the same ``DeltaFollower``.

Every copy is a real serving artifact (``lightrec.inference.export`` of the model's serving form
with quantized rows: fp16 by default, ``--row-format int8`` or ``int4``), refreshed through the
publish folder a server would follow. A copy refreshed at step ``s`` holds the model after step
``s - 1``; it scores batch ``s`` and the ``N - 1`` after it. Deltas lose nothing: at the same cadence
they give the whole copies' scores bit for bit (both round the same fp32 rows to the row format;
``tests/benchmarks/test_bench_freshness.py`` checks it), for the bytes of the rows that changed.

Run (the setting of issue 34's table: 4 features, tables of 2,000 rows, 500 batches of 1,024)::

    python benchmarks/bench_freshness.py --out bench_freshness.json

``freshness_table(...)`` is the importable entry point (for issue 34's ``benchmarks/bench_online.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_managed_collisions, beside this file

from bench_managed_collisions import DriftingStream  # noqa: E402

from lightrec.data.hashing import exact_auc, mix64  # noqa: E402
from lightrec.distributed.deltas import DeltaWriter, publish_rows, publish_snapshot, table_specs  # noqa: E402
from lightrec.inference import Predictor, export, load, quantize  # noqa: E402
from lightrec.kernels import FusedEmbeddingBagCollection  # noqa: E402
from lightrec.models._sparse_arch import SparseArch  # noqa: E402
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from lightrec.modules.managed_collision import (  # noqa: E402
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    MCHManagedCollisionModule,
)
from lightrec.serving.deltas import DeltaFollower  # noqa: E402
from lightrec.sparse import KeyedJaggedTensor  # noqa: E402

__all__ = ["FreshnessConfig", "freshness_table"]

NEVER = 0  # the cadence of a copy that is never refreshed


@dataclass(frozen=True)
class FreshnessConfig:
    """The stream, the model and what is measured (defaults: issue 34's setting).

    Attributes:
        tables / rows / dim: features (one table each), rows per managed table, embedding width.
        batch / steps: samples per step, steps of the stream.
        vocab_factor / window / signal: the stream's distinct ids per table (in rows), ids alive at
            once (share of rows), and the planted effect per feature (``DriftingStream``).
        id_bits: raw ids are ``id_bits``-bit hashes (the tables' ``input_hash_size`` is ``2**id_bits``).
        lr / dense_lr: fused row-wise Adagrad of the tables, Adagrad of the dense layers.
        eviction_interval: steps between the managed tables' LRU eviction rounds.
        cadences: refresh every ``N`` steps; 0: never (frozen at the start of the measured half).
        row_format: the serving artifact's rows (``"fp16"``, ``"int8"`` or ``"int4"``: the export of
            an unquantized managed-collision model does not trace today).
        seed: fixes the stream and the initial weights.
    """

    tables: int = 4
    rows: int = 2000
    dim: int = 16
    batch: int = 1024
    steps: int = 500
    vocab_factor: float = 10.0
    window: float = 0.5
    signal: float = 2.0
    id_bits: int = 62
    lr: float = 0.05
    dense_lr: float = 0.01
    eviction_interval: int = 10
    cadences: tuple[int, ...] = (1, 10, 50, NEVER)
    row_format: str = "fp16"
    seed: int = 0


class HashedStream(DriftingStream):
    """``DriftingStream`` whose raw ids are ``id_bits``-bit hashes of their birth numbers."""

    def __init__(self, config: FreshnessConfig) -> None:
        super().__init__(config.tables, config.rows, config.batch, config.steps, config.vocab_factor, config.window,
                         config.signal, config.seed)  # fmt: skip
        self.id_bits = config.id_bits

    def raw_ids(self, table: int, births: np.ndarray) -> np.ndarray:
        salted = births.astype(np.uint64) + np.uint64((self.seed * 131 + table) << 40)
        return (mix64(salted) >> np.uint64(64 - self.id_bits)).astype(np.int64)


class TouchRecorder(ManagedCollisionEmbeddingBagCollection):
    """A managed-collision collection that also reports the rows each forward touched.

    ``touched`` collects, per table, the rows looked up (their values change in the fused backward)
    and the rows an eviction reset (their values and ids change) -- every row that differs after
    the step. (``lightrec.distributed.model_tracker`` does this for sharded models.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, return_remapped_features=True, **kwargs)
        self.touched: dict[str, list[torch.Tensor]] = {}

    def reset_evicted_rows(self, evictions: dict[str, torch.Tensor | None]) -> None:
        for table, rows in evictions.items():
            if rows is not None and rows.numel():
                self.touched.setdefault(table, []).append(rows.detach().clone())
        super().reset_evicted_rows(evictions)

    def forward(self, features: KeyedJaggedTensor) -> tuple[Any, KeyedJaggedTensor | None]:
        embeddings, remapped = super().forward(features)
        if self.training and remapped is not None:
            for config in self._table_configs.values():
                for feature in config.feature_names:
                    self.touched.setdefault(config.name, []).append(remapped[feature].values().detach().clone())
        return embeddings, None

    def take(self) -> dict[str, torch.Tensor]:
        """``{table: unique rows}`` touched since the last ``take``."""
        out = {t: torch.unique(torch.cat(rows)) for t, rows in self.touched.items()}
        self.touched = {}
        return out


class FreshnessModel(nn.Module):
    """Concatenated pooled embeddings of the managed tables, then one hidden layer: ``kjt -> logits [B, 1]``."""

    def __init__(self, collection: nn.Module, features: int, dim: int) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(collection)
        self.over_arch = nn.Sequential(nn.Linear(features * dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return self.over_arch(self.sparse_arch(sparse_features).flatten(1))


def _configs(c: FreshnessConfig) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(num_embeddings=c.rows, embedding_dim=c.dim, name=f"t{t}", feature_names=[f"f{t}"],
                               weight_init_max=0.01, weight_init_min=-0.01) for t in range(c.tables)]  # fmt: skip


def _id_maps(c: FreshnessConfig, configs: list[EmbeddingBagConfig]) -> ManagedCollisionCollection:
    modules = {
        t.name: MCHManagedCollisionModule(c.rows, "cpu", LRU_EvictionPolicy(), c.eviction_interval,
                                          input_hash_size=2**c.id_bits)
        for t in configs
    }  # fmt: skip
    return ManagedCollisionCollection(modules, configs)  # type: ignore[arg-type]


def build_trainer(c: FreshnessConfig) -> tuple[FreshnessModel, TouchRecorder, torch.optim.Optimizer]:
    """The model trained online (fused tables behind managed collisions), its collection and dense optimizer."""
    torch.manual_seed(c.seed)
    configs = _configs(c)
    tables = FusedEmbeddingBagCollection(configs, fused_params={"optimizer": "ROWWISE_ADAGRAD", "learning_rate": c.lr})
    collection = TouchRecorder(tables, _id_maps(c, configs))
    model = FreshnessModel(collection, c.tables, c.dim)
    return model, collection, torch.optim.Adagrad(model.over_arch.parameters(), lr=c.dense_lr)


def serving_form(c: FreshnessConfig, trained: nn.Module) -> nn.Module:
    """The trained model with plain tables (what is exported and published), in eval mode."""
    configs = _configs(c)
    plain = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(configs), _id_maps(c, configs))
    model = FreshnessModel(plain, c.tables, c.dim)
    model.load_state_dict(trained.state_dict())
    return model.eval()


def kjt_of(c: FreshnessConfig, raw: np.ndarray) -> KeyedJaggedTensor:
    """Raw ids ``[T, B]`` as a KJT (one id per sample and feature)."""
    values = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1))
    return KeyedJaggedTensor(keys=[f"f{t}" for t in range(c.tables)], values=values,
                             lengths=torch.ones(values.numel(), dtype=torch.int64))  # fmt: skip


@dataclass
class ServedCopy:
    """One serving artifact, the folder it follows and what it measured."""

    name: str
    cadence: int
    predictor: Predictor
    follower: DeltaFollower | None
    writer: DeltaWriter | None
    whole: bool
    pending: dict[str, torch.Tensor] = field(default_factory=dict)  # deltas: rows touched since the last refresh
    scores: list[np.ndarray] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def due(self, step: int, start: int) -> bool:
        return self.cadence != NEVER and (step - start) % self.cadence == 0 and step > start


def _version_bytes(folder: Path, version: int) -> int:
    manifest = json.loads((folder / f"v{version:09d}" / "manifest.json").read_text())
    return sum(int(r["bytes"]) for r in manifest["files"].values())


def _serve(c: FreshnessConfig, model: nn.Module) -> nn.Module:
    return quantize(model, dtype=c.row_format)


def freshness_table(config: FreshnessConfig | None = None, workdir: str | os.PathLike[str] | None = None,
                    **overrides: Any) -> dict[str, Any]:  # fmt: skip
    """Train online on the drifting stream and score the second half with every kind of serving copy.

    Args:
        config: the setting (default ``FreshnessConfig()``); ``overrides`` replace its fields.
        workdir: where the publish folders and artifacts go (default: a temporary folder, removed).

    Returns:
        ``{"config", "trainer": {"auc"}, "whole": {N: {...}}, "delta": {N: {...}}, "table_bytes"}``: per
        cadence ``N`` (``"never"`` for 0) the AUC over the second half, the refreshes, the mean bytes
        per refresh (the version's files), the mean rows per refresh and the mean seconds to publish
        and apply one refresh. The scores themselves are under ``"scores"`` (numpy arrays) for tests.
    """
    c = FreshnessConfig(**{**asdict(config or FreshnessConfig()), **overrides})
    if c.row_format not in ("fp16", "int8", "int4"):
        raise ValueError(f"row_format must be 'fp16', 'int8' or 'int4' (the served rows), got {c.row_format!r}")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="lightrec-freshness-") as tmp:
            return freshness_table(c, tmp)
    root = Path(workdir)
    torch.set_num_threads(1)
    stream = HashedStream(c)
    model, collection, dense_optimizer = build_trainer(c)
    start = c.steps // 2
    copies: list[ServedCopy] = []
    trainer_scores, labels_seen = [], []
    started = time.perf_counter()
    for step in range(c.steps):
        raw, _, labels = stream.step(step)
        kjt = kjt_of(c, raw)
        if step == start:
            copies = _start_copies(c, model, root)
            collection.take()  # deltas count the rows touched from here on
        elif step > start:
            touched = collection.take()  # by the steps since the last one
            for copy in copies:
                if not copy.whole:
                    copy.pending = _merge(copy.pending, touched)
                if copy.due(step, start):
                    _refresh(c, model, copy, step)
        if step >= start:
            for copy in copies:
                copy.scores.append(copy.predictor.probabilities(torch.zeros(c.batch, 0), kjt.values(),
                                                                kjt.lengths()).numpy())  # fmt: skip
        model.train()
        logits = model(kjt).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(labels))
        dense_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        if step >= start:
            trainer_scores.append(torch.sigmoid(logits.detach()).numpy())
            labels_seen.append(labels)
    y = np.concatenate(labels_seen)
    return _results(c, copies, np.concatenate(trainer_scores), y, time.perf_counter() - started)


def _merge(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {t: torch.unique(torch.cat([a[t], b[t]]) if t in a and t in b else a.get(t, b.get(t))) for t in {*a, *b}}


def _start_copies(c: FreshnessConfig, model: nn.Module, root: Path) -> list[ServedCopy]:
    """Every serving copy, each loaded from an artifact of the model as it is now (version 1 of its folder)."""
    served = serving_form(c, model)
    artifact = export(_serve(c, served), root / "served.pt")
    copies = []
    for kind in ("whole", "delta"):
        for cadence in c.cadences:
            if cadence == NEVER and kind == "delta":
                continue  # never refreshed: the same copy either way
            name = f"{kind}_{cadence or 'never'}"
            writer = follower = None
            if cadence != NEVER:
                folder = root / name
                writer = DeltaWriter(folder, table_specs(served, c.row_format), retention=2)
                publish_snapshot(served, writer, global_step=0)
                follower = DeltaFollower(folder, poll_interval_s=0.0, start_version=1)
            copies.append(ServedCopy(name, cadence, load(artifact), follower, writer, kind == "whole"))
    return copies


def _refresh(c: FreshnessConfig, model: nn.Module, copy: ServedCopy, step: int) -> None:
    """Publish what ``copy`` needs (a snapshot, or the rows touched since its last refresh) and apply it."""
    assert copy.writer is not None and copy.follower is not None
    began = time.perf_counter()
    if copy.whole:
        version = publish_snapshot(model, copy.writer, global_step=step)
        copy.rows.append(c.tables * c.rows)
    else:
        rows, copy.pending = copy.pending, {}
        version = publish_rows(model, copy.writer, rows, dense=True, global_step=step)
        copy.rows.append(sum(int(r.numel()) for r in rows.values()))
    if copy.follower.sync(copy.predictor, force=True) != version:
        raise RuntimeError(f"{copy.name}: the serving copy did not reach version {version} at step {step}")
    copy.seconds.append(time.perf_counter() - began)
    copy.bytes.append(_version_bytes(Path(copy.writer.dirpath), version))


def _results(c: FreshnessConfig, copies: list[ServedCopy], trainer: np.ndarray, y: np.ndarray,
             seconds: float) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"config": asdict(c), "trainer": {"auc": exact_auc(trainer, y)}, "whole": {}, "delta": {},
                           "scores": {"trainer": trainer, "labels": y}, "seconds": seconds}  # fmt: skip
    for copy in copies:
        scores = np.concatenate(copy.scores)
        key = str(copy.cadence or "never")
        out["scores"][copy.name] = scores
        out["whole" if copy.whole else "delta"][key] = {
            "auc": exact_auc(scores, y),
            "refreshes": len(copy.bytes),
            "bytes_per_refresh": float(np.mean(copy.bytes)) if copy.bytes else 0.0,
            "rows_per_refresh": float(np.mean(copy.rows)) if copy.rows else 0.0,
            "seconds_per_refresh": float(np.mean(copy.seconds)) if copy.seconds else 0.0,
        }
    out["table_rows"] = c.tables * c.rows
    return out


def report(out: dict[str, Any]) -> str:
    """The table as text: AUC, bytes and rows per refresh of whole copies and deltas, per cadence."""
    whole, delta = out["whole"], out["delta"]
    lines = [f"{'refresh every':<14} {'whole AUC':>9} {'delta AUC':>9} {'whole bytes':>12} {'delta bytes':>12} "
             f"{'delta/whole':>11} {'rows/refresh':>12}"]  # fmt: skip
    for key, w in whole.items():
        d = delta.get(key)
        if d is None:
            lines.append(f"{key:<14} {w['auc']:>9.4f} {'(same)':>9}")
            continue
        if not w["refreshes"]:  # a cadence longer than the measured half: never refreshed in it
            lines.append(f"{key + ' steps':<14} {w['auc']:>9.4f} {d['auc']:>9.4f}   (no refresh in the measured half)")
            continue
        share = d["bytes_per_refresh"] / w["bytes_per_refresh"]
        lines.append(f"{key + ' steps':<14} {w['auc']:>9.4f} {d['auc']:>9.4f} {w['bytes_per_refresh']:>12,.0f} "
                     f"{d['bytes_per_refresh']:>12,.0f} {share:>10.1%} {d['rows_per_refresh']:>7,.0f}/{out['table_rows']}")  # fmt: skip
    lines.append(f"trainer (progressive, each batch scored before it trains): AUC {out['trainer']['auc']:.4f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = FreshnessConfig()
    for name, value in asdict(defaults).items():
        if name == "cadences":
            parser.add_argument("--cadences", type=int, nargs="+", default=list(value), help="0: never")
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = vars(parser.parse_args())
    out_path = args.pop("out")
    args["cadences"] = tuple(args["cadences"])
    out = freshness_table(FreshnessConfig(**args))
    print(report(out))
    print(f"({out['seconds']:.1f} s)")
    if out_path:
        figures = {k: v for k, v in out.items() if k != "scores"}
        figures["platform"] = {"python": platform.python_version(), "torch": torch.__version__}
        Path(out_path).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
