"""The other artifacts ``lightrec serve`` takes, each behind a real server: an int8 ``torch.export``
program of a managed-collision DLRM (raw ids anywhere in the id space, unseen ones to the default
row), and the same served on a GPU (``-m gpu``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightrec.inference import export, load, quantize
from tests.inference.test_mc_serving import SPACE, trained_dlrm
from tests.serving.server_process import free_port, running_server, serve_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")


@pytest.fixture(scope="module")
def float_model() -> torch.nn.Module:
    return trained_dlrm()


@pytest.fixture(scope="module")
def artifact(float_model: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    q = quantize(float_model, dtype=torch.int8)
    return export(q, tmp_path_factory.mktemp("mc") / "mc_int8.pt2", format="export")


def _requests(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, SPACE, (n, 2), generator=g).tolist()  # raw ids, mostly never seen in training
    return [{"dense": torch.rand(3, generator=g).tolist(), "sparse": {"f0": [a, SPACE - 1], "f1": [b]}}
            for a, b in ids]  # fmt: skip


def _serve_and_compare(artifact: Path, float_model: torch.nn.Module, log: Path, device: str) -> None:
    port = free_port()
    options = ["--accelerator", "cuda", "--devices", "1"] if device == "cuda" else ["--accelerator", "cpu"]
    predictor = load(artifact, device=device)
    samples = _requests(8)
    with running_server(serve_command(artifact, port, *options), port, log) as url:
        got = []
        for sample in samples:  # one at a time: the same batch of one as predict([sample])
            answer = requests.post(f"{url}/predict", json=sample, timeout=30)
            assert answer.status_code == 200, answer.text
            got.append(answer.json()["scores"][0])
        scores = torch.tensor(got, dtype=torch.float32)
        want = torch.cat([predictor.predict([s]) for s in samples])
        assert torch.equal(scores, want) if device == "cpu" else torch.allclose(scores, want, atol=1e-6)
        dense = torch.tensor([s["dense"] for s in samples])
        from lightrec.sparse import KeyedJaggedTensor

        kjt = KeyedJaggedTensor(["f0", "f1"], torch.tensor([i for s in samples for i in s["sparse"]["f0"]]
                                                            + [i for s in samples for i in s["sparse"]["f1"]]),
                                lengths=torch.tensor([2] * len(samples) + [1] * len(samples)))  # fmt: skip
        with torch.no_grad():
            reference = torch.sigmoid(float_model(dense, kjt)).squeeze(1)
        assert (scores - reference).abs().max() < 0.02  # int8 rows: within the row format's error of fp32
        too_big = {"dense": [0.0] * 3, "sparse": {"f0": [SPACE]}}
        error = requests.post(f"{url}/predict", json=too_big, timeout=30)
        assert error.status_code == 422 and error.json()["field"] == "sparse.f0[0]" and "raw ids" in error.json()["error"]


@pytest.mark.slow
def test_int8_exported_program_of_managed_collision_tables(artifact: Path, float_model: torch.nn.Module,
                                                           tmp_path: Path) -> None:
    _serve_and_compare(artifact, float_model, tmp_path / "server.log", "cpu")


@pytest.mark.gpu
def test_served_on_a_gpu(artifact: Path, float_model: torch.nn.Module, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _serve_and_compare(artifact, float_model, tmp_path / "server.log", "cuda")
