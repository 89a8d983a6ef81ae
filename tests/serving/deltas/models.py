"""Small trained models for the delta-application tests: a DLRM, a sequence model, a managed-collision
DLRM; their batches; training that changes some rows; the rows that changed; and :class:`Trainer`,
a DLRM whose rows change by hand and are published into a folder, version after version."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lightrec import KeyedJaggedTensor
from lightrec.distributed.deltas import DeltaWriter, publish_rows, publish_snapshot, table_rows, table_specs
from lightrec.inference import Predictor
from lightrec.models import DLRM
from tests.inference.helpers import dlrm, kjt, sequence_model
from tests.inference.test_mc_serving import _batch, trained_dlrm

Batch = tuple[torch.Tensor, KeyedJaggedTensor]


def build(kind: str) -> tuple[nn.Module, Callable[[int], Batch]]:
    """The model and a batch maker (``seed -> (dense, kjt)``) of ``kind``: dlrm | seq | mc."""
    if kind == "dlrm":
        return dlrm(), lambda s: (torch.randn(6, 5, generator=torch.Generator().manual_seed(s)), kjt(6, s))
    if kind == "seq":
        return sequence_model(), lambda s: (torch.zeros(6, 0), kjt(6, s))
    return trained_dlrm(), lambda s: (torch.randn(6, 3, generator=torch.Generator().manual_seed(s)), _batch(6, 100 + s))


def forward(model: nn.Module, batch: Batch, takes_dense: bool = True) -> torch.Tensor:
    return model(*batch) if takes_dense else model(batch[1])


def train(model: nn.Module, batches: list[Batch], takes_dense: bool = True) -> None:
    """A few SGD steps (managed-collision tables also insert and evict ids)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for batch in batches:
        opt.zero_grad()
        forward(model, batch, takes_dense).sum().backward()
        opt.step()
    model.eval()


def changed_rows(before: dict, model: nn.Module) -> dict[str, torch.Tensor]:
    """``{table: ids}`` of the rows whose values or raw ids differ from ``before`` (``table_rows``)."""
    out = {}
    for name, rows in table_rows(model).items():
        diff = (rows.values != before[name].values).any(dim=1)
        if rows.raw_ids is not None:
            diff |= rows.raw_ids != before[name].raw_ids
        out[name] = rows.ids[diff]
    return out


def cat_batches(batches: list[Batch]) -> Batch:
    """One batch holding the samples of ``batches`` (every id they had)."""
    keys = batches[0][1].keys()
    dense = torch.cat([b[0] for b in batches])
    per_key = [[b[1][k] for b in batches] for k in keys]
    values = torch.cat([jt.values() for jts in per_key for jt in jts])
    lengths = torch.cat([jt.lengths() for jts in per_key for jt in jts])
    return dense, KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


PROBE = (torch.randn(8, 5, generator=torch.Generator().manual_seed(3)), kjt(8, 3, max_len=6))


class Trainer:
    """``dlrm()`` whose rows change by hand, publishing into ``folder`` (versions numbered from 1).

    Args:
        folder: the publish folder.
        retention: the writer's.
        row_format: the rows' format in the folder (the served artifact's: ``"fp32"``, ``"int8"``...).
    """

    def __init__(self, folder: Path, retention: int | None = None, row_format: str = "fp32") -> None:
        self.folder = Path(folder)
        self.model = dlrm()
        self.specs = table_specs(self.model, row_format)
        self.retention = retention
        self.writer = DeltaWriter(folder, self.specs, retention=retention)
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.ids: dict[int, dict[str, torch.Tensor]] = {}  # the rows each delta changed

    def reopen(self) -> None:
        """A new writer: the folder holds versions this one did not write (a writer counts its own)."""
        self.writer = DeltaWriter(self.folder, self.specs, retention=self.retention)

    def _keep(self, version: int) -> int:
        self.states[version] = {k: v.clone() for k, v in self.model.state_dict().items()}
        return version

    def snapshot(self) -> int:
        return self._keep(publish_snapshot(self.model, self.writer))

    def step(self, seed: int, dense: bool = False, ids: dict[str, torch.Tensor] | None = None) -> int:
        """Change rows -- ``ids`` per table, else 5 random rows of every table -- (and, with ``dense``,
        the dense weights) and publish them."""
        g = torch.Generator().manual_seed(seed)
        bags = self.model.sparse_arch.embedding_bag_collection.embedding_bags
        ids = ids or {name: torch.randperm(bag.weight.shape[0], generator=g)[:5] for name, bag in bags.items()}
        with torch.no_grad():
            for name, rows in ids.items():
                bags[name].weight[rows] += torch.randn(rows.numel(), bags[name].weight.shape[1], generator=g)
            for p in self.model.dense_arch.parameters() if dense else []:
                p.add_(0.1)
        version = publish_rows(self.model, self.writer, ids, dense=dense)
        self.ids[version] = ids
        return self._keep(version)

    def model_at(self, version: int, state: dict[str, torch.Tensor] | None = None) -> DLRM:
        model = dlrm()
        model.load_state_dict(state or self.states[version])
        return model.eval()

    def scores(self, version: int, state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.model_at(version, state)(*PROBE)


def probe_scores(predictor: Predictor) -> torch.Tensor:
    return predictor(PROBE[0], PROBE[1].values(), PROBE[1].lengths())


def corrupt(folder: Path, version: int) -> None:
    """Flip a byte of ``version``'s rows file (its checksum then fails)."""
    path = folder / f"v{version:09d}" / "rows.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
