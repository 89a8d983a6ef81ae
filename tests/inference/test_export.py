"""Artifacts: TorchScript and torch.export reproduce the model; they load without lightrec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.inference import ExportError, RequestError, export, export_from_checkpoint, load, quantize
from tests.inference.helpers import FEATURES, dlrm, kjt

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fmt,suffix", [("torchscript", "pt"), ("export", "pt2")])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_artifact_reproduces_model(tmp_path: Path, fmt: str, suffix: str, dtype: str, device: torch.device) -> None:
    q = quantize(dlrm(), dtype)
    path = export(q, tmp_path / f"m.{suffix}", format=fmt)
    meta = json.loads(Path(f"{path}.meta.json").read_text())
    assert meta["feature_names"] == FEATURES and meta["dense_in_features"] == 5
    assert meta["versions"]["torch"] == torch.__version__ and meta["dtype"] == [dtype.upper()]
    predictor = load(path, device=device)  # the artifact is written on CPU; served on `device`
    q = q.to(device)
    for batch_size in (1, 4, 9):  # dynamic batch size (export: B=1 is padded by the Predictor)
        batch, dense = kjt(batch=batch_size, seed=batch_size).to(device), torch.randn(batch_size, 5, device=device)
        want = q(dense, batch)
        got = predictor(dense.cpu(), batch.values().cpu(), batch.lengths().cpu())  # moved to `device` by it
        assert got.device.type == device.type
        if batch_size == 1 and fmt == "export":  # scored as a batch of 2: matmul blocking may move the last bit
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(got, want)
            # int32 ids / lengths (as many KJTs carry them) are accepted as well
            assert torch.equal(predictor(dense, batch.values().int(), batch.lengths().int()), want)


def test_exported_program_is_moved_whole_to_the_serving_device(tmp_path: Path) -> None:
    """torch.export writes the tracing device into the graph (device checks, constructors); `load`
    rewrites every one of them, not just the weights (which alone fails on a GPU: "Tensor device
    mismatch! Expected: cpu, Got: cuda:0"). "meta" stands in for the GPU here."""
    path = export(quantize(dlrm(), "int8"), tmp_path / "m.pt2", format="export")

    def devices(module: torch.nn.Module) -> list[str]:
        return [torch.device(n.kwargs["device"]).type for n in module.graph.nodes if "device" in n.kwargs]

    assert "cpu" in devices(load(path).module)  # the CPU artifact names its device in the graph ...
    moved = load(path, device="meta").module
    assert set(devices(moved)) == {"meta"}  # ... and every mention is rewritten
    assert {t.device.type for t in [*moved.parameters(), *moved.buffers()]} == {"meta"}


def test_sharded_model_exports_as_torchscript(tmp_path: Path) -> None:
    from lightrec.inference import shard_for_inference

    sharded = shard_for_inference(quantize(dlrm(), "int8"), devices=2)
    path = export(sharded, tmp_path / "s.pt")
    batch, dense = kjt(), torch.randn(5, 5)
    assert torch.equal(load(path)(dense, batch.values(), batch.lengths()), sharded(dense, batch))
    if fbgemm_available():
        with pytest.raises(ExportError, match="IntNBitTableBatchedEmbeddingBagsCodegen"):
            export(sharded, tmp_path / "s.pt2", format="export")


_CHILD = """
import sys
assert not any("lightrec" in p or p in ("", ".") for p in sys.path[:1]), sys.path
{pre}
import torch
m = torch.jit.load(sys.argv[1])
data = torch.load(sys.argv[2])
out = m(data["dense"], data["values"], data["lengths"])
assert torch.equal(out, data["want"]), (out, data["want"])
assert "lightrec" not in sys.modules
print("fbgemm" in sys.modules or "fbgemm_gpu" in sys.modules)
"""


def _run_child(tmp_path: Path, artifact: Path, q: torch.nn.Module, pre: str, env: dict[str, str]) -> str:
    batch, dense = kjt(batch=6), torch.randn(6, 5)
    torch.save({"dense": dense, "values": batch.values(), "lengths": batch.lengths(), "want": q(dense, batch)},
               tmp_path / "data.pt")
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_CHILD.format(pre=pre)))
    done = subprocess.run([sys.executable, "-I", str(script), str(artifact), str(tmp_path / "data.pt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu is unavailable")
def test_torchscript_loads_without_lightrec_with_fbgemm(tmp_path: Path) -> None:
    q = quantize(dlrm(), "int8")
    path = export(q, tmp_path / "m.pt")
    assert json.loads(Path(f"{path}.meta.json").read_text())["uses_fbgemm"] is True
    assert _run_child(tmp_path, path, q, "import fbgemm_gpu", {"PATH": os.environ.get("PATH", "")}) == "True"


_EXPORT_NO_FBGEMM = """
import sys, torch
sys.path.insert(0, {repo!r})
from tests.fbgemm_block import install_fbgemm_block
install_fbgemm_block()
from lightrec.inference import export, quantize
from tests.inference.helpers import dlrm
q = quantize(dlrm(), "int8")
export(q, sys.argv[1])
torch.save(q, sys.argv[2])
"""


def test_torchscript_loads_with_only_torch(tmp_path: Path) -> None:
    """Export where fbgemm cannot be imported (pure-torch kernels), load with torch alone."""
    maker = tmp_path / "make.py"
    maker.write_text(_EXPORT_NO_FBGEMM.format(repo=str(REPO)))
    done = subprocess.run([sys.executable, str(maker), str(tmp_path / "m.pt"), str(tmp_path / "q.pt")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "m.pt.meta.json").read_text())["uses_fbgemm"] is False
    q = torch.load(tmp_path / "q.pt", weights_only=False)
    assert _run_child(tmp_path, tmp_path / "m.pt", q, "", {"PATH": os.environ.get("PATH", "")}) == "False"


def test_export_from_checkpoint_with_lightning_prefix(tmp_path: Path) -> None:
    trained = dlrm(seed=3)
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in trained.state_dict().items()}, "epoch": 1}, ckpt)
    path = export_from_checkpoint(ckpt, lambda: dlrm(seed=9), tmp_path / "m.pt", dtype=torch.int8)
    batch, dense = kjt(), torch.randn(5, 5)
    assert torch.equal(load(path)(dense, batch.values(), batch.lengths()), quantize(trained, "int8")(dense, batch))
    with pytest.raises(FileNotFoundError):
        export_from_checkpoint(tmp_path / "missing.ckpt", dlrm, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="do not match"):
        export_from_checkpoint({"w": torch.zeros(1)}, dlrm, tmp_path / "x.pt")


def test_predictor_scores_and_rejects_bad_requests(tmp_path: Path) -> None:
    q = quantize(dlrm(), "int8")
    predictor = load(export(q, tmp_path / "m.pt"))
    good = [{"dense": [0.5] * 5, "sparse": {"f0": [1, 2], "f1": [3], "f2": [], "f3": [16]}},
            {"dense": [0.0, 1, 2, 3, 4], "sparse": {"f0": [39]}}]  # missing features = no ids
    scores = predictor.predict(good)
    values = torch.tensor([1, 2, 39, 3, 16])
    lengths = torch.tensor([2, 1, 1, 0, 0, 0, 1, 0])
    dense = torch.tensor([[0.5] * 5, [0.0, 1, 2, 3, 4]])
    from lightrec import KeyedJaggedTensor

    want = torch.sigmoid(q(dense, KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths))).squeeze(1)
    assert torch.equal(scores, want) and bool(((scores > 0) & (scores < 1)).all())
    bad = {
        "unknown features \\['nope'\\]": {"dense": [0.0] * 5, "sparse": {"nope": [1]}},
        "id 40, outside \\[0, 40\\)": {"dense": [0.0] * 5, "sparse": {"f1": [40]}},
        "non-integer id 1.5": {"dense": [0.0] * 5, "sparse": {"f1": [1.5]}},
        "list of 5 floats, got 4 values": {"dense": [0.0] * 4, "sparse": {}},
        "'dense' is missing": {"sparse": {"f0": [1]}},
        "not a finite number": {"dense": [float("nan")] * 5, "sparse": {}},
        "not weighted": {"dense": [0.0] * 5, "sparse": {"f0": [1]}, "weights": {"f0": [1.0]}},
        "unknown keys": {"dense": [0.0] * 5, "spares": {}},
        "unknown keys \\[7, 'spares'\\]": {"dense": [0.0] * 5, "spares": {}, 7: 1},  # mixed key types: no TypeError
        "unknown features \\[3, 'nope'\\]": {"dense": [0.0] * 5, "sparse": {"nope": [1], 3: [1]}},
    }
    for message, request in bad.items():
        with pytest.raises(RequestError, match=f"request 1: .*{message}"):
            predictor.predict([good[0], request])
    strict = load(tmp_path / "m.pt", missing_features="error")
    with pytest.raises(RequestError, match="request 0: missing features"):
        strict.predict([good[1]])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "torchscr', "not JSON"),
        ("", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"feature_names": ["f0"], "tables": []}', "field 'format' is None"),
        ('{"format": "TorchScript", "feature_names": ["f0"], "tables": []}', "field 'format' is TorchScript"),
        ('{"format": "torchscript", "tables": []}', "field 'feature_names' is None"),
        ('{"format": "torchscript", "feature_names": ["f0"], "tables": [{"feature_names": ["f0"]}]}', "field 'tables'"),
    ],
)
def test_metadata_that_export_did_not_write_is_a_typed_error_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    from lightrec.inference import ArtifactMetaError

    path = export(quantize(dlrm(), "int8"), tmp_path / "m.pt")
    meta = tmp_path / "m.pt.meta.json"
    meta.write_text(text)
    with pytest.raises(ArtifactMetaError, match=f"'{meta}': {message}.*export the model again"):
        load(path)


@pytest.mark.parametrize("format", ["torchscript", "export"])
def test_an_artifact_beside_another_exports_metadata_is_refused(tmp_path: Path, format: str) -> None:
    """The artifact and its ``.meta.json`` are moved into place one after the other: an export killed
    between the two (or a reader between them) leaves a new artifact beside the old metadata. Both
    carry one export id, and ``load`` refuses a pair whose ids differ; a whole export loads."""
    import importlib

    from lightrec.inference import ArtifactMetaError

    export_module = importlib.import_module("lightrec.inference.export")  # (the package's `export` is the function)
    path = tmp_path / ("m.pt" if format == "torchscript" else "m.pt2")
    export(quantize(dlrm(0), "int8"), path, format=format)
    old_meta = (tmp_path / f"{path.name}.meta.json").read_text()
    assert json.loads(old_meta)["export_id"]
    load(path)  # a whole export

    real = export_module._write_atomically

    def killed_before_the_metadata(target: Path, write: object) -> None:
        if str(target).endswith(".meta.json"):
            raise KeyboardInterrupt  # the process stops between the two renames
        real(target, write)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(export_module, "_write_atomically", killed_before_the_metadata)
        with pytest.raises(KeyboardInterrupt):
            export(quantize(dlrm(1), "int8"), path, format=format)
    assert (tmp_path / f"{path.name}.meta.json").read_text() == old_meta  # the old one, beside a new artifact
    with pytest.raises(ArtifactMetaError, match=r"belongs to another export than .*export the model again"):
        load(path)
    export(quantize(dlrm(1), "int8"), path, format=format)  # the next whole export loads
    load(path)


def test_artifacts_exported_before_export_ids_still_load(tmp_path: Path) -> None:
    path = export(quantize(dlrm(), "int8"), tmp_path / "m.pt")
    meta_path = tmp_path / "m.pt.meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["export_id"]
    meta_path.write_text(json.dumps(meta))
    load(path)
