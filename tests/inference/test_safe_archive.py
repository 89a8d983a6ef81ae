"""``load`` refuses torch.export archives that would unpickle code; lightrec's own exports load."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lightrec.inference import UnsafeArtifactError, export, load, quantize
from tests.inference.helpers import dlrm, kjt


class _WritesMarker:
    """Unpickling this writes ``marker`` (what a hostile artifact would do instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, ...]:
        return (eval, (f"(open({self.marker!r}, 'w').write('ran'), __import__('torch').zeros(1))[1]",))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("pt2") / "m.pt2", format="export")


Edit = Callable[[str, bytes], bytes | None]  # (name inside the root, data) -> new data, None drops it


def _rewrite(src: Path, dst: Path, edit: Edit, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/")[0] + "/"
        for info in zin.infolist():
            data = edit(info.filename[len(root):], zin.read(info.filename))
            if data is not None:
                zout.writestr(info, data)
        for name, data in (extra or {}).items():
            zout.writestr(name, data)
    shutil.copy(f"{src}.meta.json", f"{dst}.meta.json")
    return dst


def _pickled(marker: Path) -> bytes:
    buf = io.BytesIO()
    pickle.dump(_WritesMarker(marker), buf)
    return buf.getvalue()


def _config(data: bytes, change: Callable[[dict], None]) -> bytes:
    config = json.loads(data)
    change(config["config"])
    return json.dumps(config).encode()


def test_pickled_weight_is_refused_before_it_runs(artifact: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    def edit(name: str, data: bytes) -> bytes:
        if name == "data/weights/model_weights_config.json":
            def pickle_first(config: dict) -> None:
                meta = next(iter(config.values()))
                meta["use_pickle"] = True
                meta["path_name"] = "weight_0"
            return _config(data, pickle_first)
        return _pickled(marker) if name == "data/weights/weight_0" else data

    evil = _rewrite(artifact, tmp_path / "evil.pt2", edit)
    with pytest.raises(UnsafeArtifactError, match=r"evil\.pt2.*model_weights_config\.json.*use_pickle.*re-export") as err:
        load(evil)
    assert not marker.exists()  # nothing in the file ran
    assert err.value.path.endswith("evil.pt2") and "model_weights_config.json" in err.value.entry


def test_pickled_or_opaque_constant_is_refused(artifact: Path, tmp_path: Path) -> None:
    def opaque(config: dict) -> None:
        next(iter(config.values()))["path_name"] = "opaque_obj_0"

    def pickled(config: dict) -> None:
        next(iter(config.values()))["use_pickle"] = True

    for name, change in (("opaque", opaque), ("pickled", pickled)):
        bad = _rewrite(artifact, tmp_path / f"{name}.pt2", lambda n, d, change=change: (  # type: ignore[misc]
            _config(d, change) if n == "data/constants/model_constants_config.json" else d))
        with pytest.raises(UnsafeArtifactError, match="model_constants_config.json"):
            load(bad)


def test_sample_inputs_weights_only_refuses_are_refused(artifact: Path, tmp_path: Path) -> None:
    """torch retries sample inputs that weights_only=True refuses with weights_only=False."""
    marker = tmp_path / "ran"
    bad = _rewrite(artifact, tmp_path / "inputs.pt2",
                   lambda n, d: _pickled(marker) if n == "data/sample_inputs/model.pt" else d)
    with pytest.raises(UnsafeArtifactError, match="sample_inputs/model.pt"):
        load(bad)
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["data/aotinductor/model/x.so", "data/weights/model.pt"])
def test_native_code_and_legacy_pickles_are_refused(artifact: Path, tmp_path: Path, entry: str) -> None:
    root = zipfile.ZipFile(artifact).namelist()[0].split("/")[0]
    bad = _rewrite(artifact, tmp_path / "x.pt2", lambda n, d: d, {f"{root}/{entry}": b"\x00"})
    with pytest.raises(UnsafeArtifactError, match=entry):
        load(bad)


def test_entries_outside_the_root_are_refused(artifact: Path, tmp_path: Path) -> None:
    """torch's fallback to the pre-2.7 zip format reads top-level entries with a weights_only=False retry."""
    bad = _rewrite(artifact, tmp_path / "x.pt2", lambda n, d: d, {"version": b"1"})
    with pytest.raises(UnsafeArtifactError, match="outside the archive's root"):
        load(bad)


def test_not_a_zip_is_refused(tmp_path: Path, artifact: Path) -> None:
    bad = tmp_path / "x.pt2"
    bad.write_bytes(b"not a zip")
    shutil.copy(f"{artifact}.meta.json", f"{bad}.meta.json")
    with pytest.raises(UnsafeArtifactError, match="not a zip"):
        load(bad)


@pytest.mark.parametrize("dtype", [None, "fp16", "int8", "int4"])
def test_lightrec_exports_load(tmp_path: Path, dtype: str | None) -> None:
    model = dlrm() if dtype is None else quantize(dlrm(), dtype)
    predictor = load(export(model, tmp_path / "m.pt2", format="export"))
    batch, dense = kjt(batch=4), torch.randn(4, 5)
    with torch.no_grad():
        assert torch.equal(predictor(dense, batch.values(), batch.lengths()), model(dense, batch))
