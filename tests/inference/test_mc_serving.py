"""Serving managed-collision tables: ``quantize`` keeps the id maps frozen (no insertion, no
eviction, unknown ids to a defined row), ``export`` writes them as tensor ops (TorchScript and
``torch.export``), the TorchScript artifact loads where lightrec is not importable, ``Predictor``
takes raw ids in the tables' id space, and the quantized sequence collection shards over devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from lightrec.distributed.quant_embedding import QuantManagedCollisionEmbeddingCollectionSharder
from lightrec.inference import RequestError, export, load, quantize
from lightrec.models.dlrm import DLRM
from lightrec.modules.managed_collision import (
    HashZchManagedCollisionModule,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
    MCHManagedCollisionModule,
    mix64_hash,
)

SPACE = 2**40


def _modules(hash_func: object = mix64_hash) -> dict[str, object]:
    return {
        "t0": MCHManagedCollisionModule(20, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=SPACE, buckets=2,
                                        input_hash_func=hash_func),  # fmt: skip
        "t1": HashZchManagedCollisionModule(16, "cpu", total_num_buckets=2, max_probe=4, input_hash_size=SPACE),
    }


def _batch(n: int, seed: int) -> KeyedJaggedTensor:
    ids = torch.randint(0, SPACE, (2 * n,), generator=torch.Generator().manual_seed(seed))
    return KeyedJaggedTensor(["f0", "f1"], ids, lengths=torch.ones(2 * n, dtype=torch.int64))


def trained_dlrm(hash_func: object = mix64_hash) -> DLRM:
    torch.manual_seed(0)
    configs = [EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name="t0", feature_names=["f0"]),
               EmbeddingBagConfig(num_embeddings=16, embedding_dim=8, name="t1", feature_names=["f1"])]  # fmt: skip
    mc = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(configs),
                                                ManagedCollisionCollection(_modules(hash_func), configs))  # fmt: skip
    model = DLRM(mc, dense_in_features=3, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[4, 1])
    for step in range(6):
        model(torch.randn(6, 3), _batch(6, step)).sum().backward()
    return model.eval()


def test_quantized_model_keeps_the_id_maps_frozen() -> None:
    model = trained_dlrm()
    seen, dense = _batch(6, 5), torch.randn(6, 3)
    with torch.no_grad():
        want = model(dense, seen)
    q = quantize(model, dtype=torch.float16)
    mc = q.sparse_arch.embedding_bag_collection
    assert type(mc).__name__ == "QuantManagedCollisionEmbeddingBagCollection"
    assert torch.allclose(q(dense, seen), want, atol=1e-3)
    state = {k: v.clone() for k, v in q.state_dict().items()}
    fresh = _batch(6, 99)  # ids never seen: the default row of their bucket / their hash position
    q(dense, fresh)
    assert all(torch.equal(v, q.state_dict()[k]) for k, v in state.items())
    _, remapped = mc(fresh)
    assert remapped is None
    rows = mc._managed_collision_collection(fresh).values()
    assert set(rows[:6].tolist()) <= {9, 19}  # MCH: default rows of the two buckets (segments of 10)
    assert bool((rows[6:] < 16).all())


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_artifacts_remap_raw_ids_like_the_quantized_model(tmp_path: Path, fmt: str) -> None:
    q = quantize(trained_dlrm(), dtype=torch.float16)
    batch, dense = _batch(8, 3), torch.randn(8, 3)
    path = export(q, tmp_path / f"m.{fmt}", format=fmt, example_batch=(dense, batch))
    predictor = load(path)
    assert torch.equal(predictor(dense, batch.values(), batch.lengths()), q(dense, batch))
    assert predictor.meta["tables"][0]["id_space"] == SPACE
    assert len(predictor.predict([{"dense": [0.1, 0.2, 0.3], "sparse": {"f0": [SPACE - 1], "f1": [2**39]}}])) == 1
    with pytest.raises(RequestError, match="'f0' has id 1099511627776, outside \\[0, 1099511627776\\).*raw ids"):
        predictor.predict([{"dense": [0.1, 0.2, 0.3], "sparse": {"f0": [SPACE], "f1": [1]}}])


_CHILD = """
import sys
{pre}
import torch
m = torch.jit.load(sys.argv[1])
data = torch.load(sys.argv[2])
out = m(data["dense"], data["values"], data["lengths"])
assert torch.equal(out, data["want"]), (out, data["want"])
assert "lightrec" not in sys.modules
print("ok")
"""


def test_torchscript_artifact_loads_without_lightrec(tmp_path: Path) -> None:
    """The remappers are plain tensor ops: the artifact needs torch (and fbgemm_gpu when the
    export process had it: lightrec's jagged helpers then compile to its ops), never lightrec."""
    q = quantize(trained_dlrm(), dtype=torch.float16, use_fbgemm=False)
    path = export(q, tmp_path / "m.pt")
    uses_fbgemm = json.loads(Path(f"{path}.meta.json").read_text())["uses_fbgemm"]
    batch, dense = _batch(5, 7), torch.randn(5, 3)
    torch.save({"dense": dense, "values": batch.values(), "lengths": batch.lengths(), "want": q(dense, batch)},
               tmp_path / "data.pt")  # fmt: skip
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_CHILD.format(pre="import fbgemm_gpu" if uses_fbgemm else "")))
    done = subprocess.run([sys.executable, "-I", str(script), str(path), str(tmp_path / "data.pt")], cwd=tmp_path,
                          env={"PATH": os.environ.get("PATH", "")}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_python_hash_functions_cannot_be_served() -> None:
    model = trained_dlrm(hash_func=lambda ids, size: ids % size)
    with pytest.raises(TypeError, match="'t0'.*input_hash_func.*mix64_hash"):
        quantize(model, dtype=torch.float16)


def test_quantized_sequence_collection_shards_over_devices() -> None:
    configs = [EmbeddingConfig(num_embeddings=20, embedding_dim=8, name="t0", feature_names=["f0"]),
               EmbeddingConfig(num_embeddings=16, embedding_dim=8, name="t1", feature_names=["f1"])]  # fmt: skip
    torch.manual_seed(0)
    mc = ManagedCollisionEmbeddingCollection(EmbeddingCollection(configs), ManagedCollisionCollection(_modules(), configs),
                                             return_remapped_features=True)  # fmt: skip
    for step in range(3):
        mc(_batch(4, step))
    q = quantize(mc.eval(), dtype=torch.int8)
    sharded = QuantManagedCollisionEmbeddingCollectionSharder().shard(q, env=type("Env", (), {"world_size": 2})())
    assert sharded.group_devices() == ["cpu", "cpu"]
    batch = _batch(4, 11)
    (want, want_ids), (got, got_ids) = q(batch), sharded(batch)
    assert all(torch.equal(got[f].values(), want[f].values()) for f in ("f0", "f1"))
    assert got_ids is not None and want_ids is not None and torch.equal(got_ids.values(), want_ids.values())
