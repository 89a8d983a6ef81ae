"""A missing or mismatched fbgemm-gpu: lightrec imports, warns once, and runs its pure-torch kernels.

Each case runs in a fresh interpreter whose ``sys.path`` starts with a fake ``fbgemm_gpu``:

* one whose import raises ``OSError`` (what a wheel built for another torch does) or ``ImportError``;
* one that kills the process when imported, installed as a release built for another torch: it
  must never be imported (loading a mismatched build can crash, not just raise).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightrec import _fbgemm

SNIPPET = r"""
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import torch
    import lightrec
    from lightrec._fbgemm import FbgemmUnavailableWarning, fbgemm_available, fbgemm_unavailable_reason
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.sparse import _ops
    table = lightrec.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    ebc = FusedEmbeddingBagCollection([table], torch.optim.SGD, {"lr": 0.1})
    kjt = lightrec.KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    out = ebc(kjt).values()
    out.sum().backward()
    assert out.shape == (2, 4)
    assert fbgemm_available() is False and not _ops.USING_FBGEMM
ours = [w for w in caught if issubclass(w.category, FbgemmUnavailableWarning)]
print("WARNINGS", len(ours))
print("REASON", fbgemm_unavailable_reason())
print("MESSAGE", ours[0].message if ours else "")
"""


def _fake_fbgemm(root: Path, init: str, dist_version: str | None = None) -> Path:
    package = root / "fbgemm_gpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    if dist_version is not None:
        info = root / f"fbgemm_gpu_cpu-{dist_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: fbgemm_gpu-cpu\nVersion: {dist_version}\n"
        )
        (info / "top_level.txt").write_text("fbgemm_gpu\n")
    return root


def _run(path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTREC_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(path), str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("OSError('Could not load this library: fbgemm_gpu_tbe_index_select.so')", "OSError: Could not load"),
        ("ImportError('undefined symbol: _ZN5torch8autograd')", "ImportError: undefined symbol"),
    ],
)
def test_fbgemm_that_fails_to_import_falls_back_with_one_warning(
    tmp_path: Path, error: str, reason: str
) -> None:
    # a nightly's version: no known torch to compare with, so lightrec tries to import it
    done = _run(_fake_fbgemm(tmp_path, f"raise {error}\n", dist_version="2026.1.1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNINGS 1" in done.stdout, done.stdout
    assert f"REASON fbgemm_gpu failed to import: {reason}" in done.stdout, done.stdout
    assert "pure-torch kernels" in done.stdout and "LIGHTREC_FBGEMM=0" in done.stdout


def test_fbgemm_built_for_another_torch_is_never_imported(tmp_path: Path) -> None:
    import torch

    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    other = next(f for f, t in _fbgemm.FBGEMM_TORCH.items() if t != release)
    done = _run(_fake_fbgemm(tmp_path, "import os\nos._exit(97)\n", dist_version=f"{other}.0"))
    assert done.returncode == 0, (
        f"the fake fbgemm was imported (exit {done.returncode}): {done.stderr[-3000:]}"
    )
    assert "WARNINGS 1" in done.stdout, done.stdout
    wanted = _fbgemm.FBGEMM_TORCH[other]
    assert f"fbgemm_gpu-cpu {other}.0 is built for torch {wanted}.x" in done.stdout, done.stdout


def test_missing_fbgemm_says_so(tmp_path: Path) -> None:
    # no fbgemm_gpu module and no fbgemm distribution (simulated: a finder that reports the module
    # absent, and empty distribution metadata)
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "from importlib.abc import MetaPathFinder\n"
        "class _Absent(MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'fbgemm_gpu' or name.startswith('fbgemm_gpu.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Absent())\n"
        "import importlib.metadata\n"
        "importlib.metadata.packages_distributions = lambda: {}  # no fbgemm distribution either\n"
    )
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNINGS 1" in done.stdout and "REASON fbgemm_gpu is not installed" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("installed", "torch_version", "mismatch"),
    [
        (("fbgemm-gpu-cpu", "1.8.0"), "2.13.0+cpu", False),
        (("fbgemm-gpu", "1.8.0"), "2.14.1+cu130", True),
        (("fbgemm-gpu", "1.9.0"), "2.13.0", True),
        (("fbgemm-gpu", "1.6.0"), "2.11.0", False),
        (("fbgemm-gpu", "2026.9.1"), "2.14.1", False),  # a nightly: unknown, tried by importing it
        (None, "2.14.1", False),
    ],
)
def test_mismatch_table(
    monkeypatch: pytest.MonkeyPatch, installed: tuple[str, str] | None, torch_version: str, mismatch: bool
) -> None:
    monkeypatch.setattr(_fbgemm.torch, "__version__", torch_version)
    assert (_fbgemm._mismatch(installed) is not None) is mismatch
