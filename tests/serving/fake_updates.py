"""A stand-in for the delta follower: versions announced as small JSON files in a folder.

``DIR/v<N>.json`` announces version N: ``{"artifact": path, "published_at": t, "apply_delay_s": s,
"started_marker": path, "corrupt": bool, "fail": bool}``. ``poll`` takes the newest announced version above the
served one, loads its artifact (outside the lock, like a real updater reads and verifies files)
and returns an update that swaps the predictor in -- after writing ``started_marker`` and sleeping
``apply_delay_s`` with the lock held, to make batches wait; a ``"corrupt": true`` version is
refused with an error, like a checksum mismatch; a ``"fail": true`` one adds 1 to a dense weight of
the served model, then raises -- an apply that fails part way, which damages the worker.

The servers of the tests build it in their worker processes from :func:`open_fake_updater`
(pickled as a ``functools.partial``, the shape ``UpdaterFactory`` asks for).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lightrec.inference import Predictor, load
from lightrec.serving import ModelUpdate, ModelUpdater, ServedModel


class CorruptVersion(ValueError):
    """The announced version is marked corrupt (a stand-in for a failed checksum)."""


@dataclass
class SwapUpdate:
    version: int
    published_at: float
    predictor: Predictor
    apply_delay_s: float = 0.0
    started_marker: str | None = None
    fail: bool = False

    def apply(self, model: ServedModel) -> None:
        if self.fail:
            weight = next(p for name, p in model.predictor.module.named_parameters() if name.endswith("weight"))
            with torch.no_grad():
                weight.add_(1.0)  # half written ...
            raise OSError("the device failed half way through the update")  # ... and failed
        if self.started_marker:
            Path(self.started_marker).touch()
        if self.apply_delay_s:
            time.sleep(self.apply_delay_s)  # the lock is held: batches wait, none is dropped
        model.replace_predictor(self.predictor)


class FolderUpdater:
    def __init__(self, folder: Path, model: ServedModel) -> None:
        self.folder = folder
        self.model = model

    def poll(self) -> ModelUpdate | None:
        announced = sorted((int(p.stem[1:]), p) for p in self.folder.glob("v*.json"))
        newer = [(v, p) for v, p in announced if v > self.model.version]
        if not newer:
            return None
        version, path = newer[-1]
        spec = json.loads(path.read_text())
        if spec.get("corrupt"):
            raise CorruptVersion(f"{path.name}: marked corrupt")
        predictor = load(spec["artifact"], device=self.model.predictor.device)
        return SwapUpdate(version, float(spec.get("published_at", time.time())), predictor,
                          float(spec.get("apply_delay_s", 0.0)), spec.get("started_marker"), bool(spec.get("fail")))


def open_fake_updater(folder: str, model: ServedModel) -> ModelUpdater:
    return FolderUpdater(Path(folder), model)


def announce(folder: Path, version: int, artifact: Path, **extra: object) -> None:
    """Write ``v<version>.json`` atomically (the follower never reads half a file)."""
    tmp = folder / f".v{version}.tmp"
    tmp.write_text(json.dumps({"artifact": str(artifact), "published_at": time.time(), **extra}))
    tmp.replace(folder / f"v{version}.json")


@dataclass
class SwapPredictor:
    """A ``ModelUpdate`` that swaps in ``new`` (loaded before, outside the lock, as an updater's poll would)."""

    new: Predictor
    version: int = 1
    published_at: float = 1.0

    def apply(self, model: ServedModel) -> None:
        model.replace_predictor(self.new)
