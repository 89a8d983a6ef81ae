"""Synthetic Criteo batches drawn with torch on a device: same hidden model, host-known sizes."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from lightrec.data import SyntheticCriteo, SyntheticCriteoDataset, concat_batches
from lightrec.data.hashing import bounded_zipf, expected_auc, hash_unit, mix64, stream_key
from lightrec.data.synthetic.device import TorchPlantedSampler, _signed, torch_hash_unit, torch_mix64

SMALL = dict(num_embeddings_cap=5000)


def test_hashes_equal_numpy_bit_for_bit() -> None:
    x = np.random.default_rng(0).integers(0, 2**63, 4096, dtype=np.int64).astype(np.uint64) * np.uint64(3)
    assert np.array_equal(torch_mix64(torch.from_numpy(x.view(np.int64))).numpy().view(np.uint64), mix64(x))
    ids = np.random.default_rng(1).integers(0, 40_000_000, 4096)
    keys = torch.full((4096,), _signed(int(stream_key(7, 1003))))
    assert np.array_equal(torch_hash_unit(torch.from_numpy(ids), keys).numpy(), hash_unit(ids, 7, 1003))


@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.1])
def test_popularity_ranks_equal_bounded_zipf(exponent: float) -> None:
    ds = SyntheticCriteoDataset(
        batch_size=8, num_batches=1, num_embeddings_cap=1_000_000, zipf_exponent=exponent
    )
    sampler = TorchPlantedSampler(ds.model, "cpu")
    u = np.random.default_rng(2).random(50_000)
    for f in (0, 2, 5, 9):  # 1460 rows (head only), 1M (long tail), 24 rows, 93k
        expected = bounded_zipf(u, ds.model.num_embeddings[f], exponent)
        got = sampler.ranks(torch.from_numpy(u), torch.full((u.size,), f)).numpy()
        assert np.array_equal(got, expected), f


@pytest.mark.parametrize("distribution", ["fixed", "poisson"])
def test_device_batches_have_the_layout_and_host_known_sizes(distribution: str) -> None:
    ds = SyntheticCriteoDataset(
        batch_size=64, num_batches=3, device="cpu", ids_per_feature=2, ids_distribution=distribution, **SMALL
    )
    b = ds[1]
    kjt = b.sparse_features
    assert b.dense_features.shape == (64, 13) and b.dense_features.dtype == torch.float32
    assert kjt.keys() == ds.keys and kjt.stride() == 64 and kjt.values().dtype == torch.int64
    lengths = kjt.lengths().view(26, 64)
    assert kjt.length_per_key_or_none() == lengths.sum(dim=1).tolist()  # given, not computed
    assert kjt.values().numel() == sum(kjt.length_per_key())
    if distribution == "fixed":
        assert bool((lengths == 2).all())
    else:
        assert lengths.min() == 0 and lengths.max() > 2
    opk = kjt.offset_per_key()
    for f, n in enumerate(ds.num_embeddings_per_feature):
        ids = kjt.values()[opk[f] : opk[f + 1]]
        assert int(ids.min()) >= 0 and int(ids.max()) < n
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0}
    again = ds[1]
    assert torch.equal(again.sparse_features.values(), kjt.values()) and torch.equal(again.labels, b.labels)
    assert not torch.equal(ds[2].dense_features, b.dense_features)


def test_blocks_compose_like_the_host_generator() -> None:
    """With a fixed block size, one batch of 2B is the two batches of B (ranks see one global batch)."""
    big = SyntheticCriteoDataset(
        batch_size=32, num_batches=2, block_size=16, device="cpu", ids_per_feature=3, **SMALL
    )
    small = SyntheticCriteoDataset(
        batch_size=16, num_batches=4, block_size=16, device="cpu", ids_per_feature=3, **SMALL
    )
    joined, parts = big[1], concat_batches([small[2], small[3]])
    assert torch.equal(joined.sparse_features.values(), parts.sparse_features.values())
    assert torch.equal(joined.sparse_features.lengths(), parts.sparse_features.lengths())
    assert torch.equal(joined.dense_features, parts.dense_features) and torch.equal(
        joined.labels, parts.labels
    )
    assert joined.sparse_features.length_per_key() == parts.sparse_features.length_per_key()


def test_device_stream_has_the_host_stream_distribution() -> None:
    """Another sample stream, the same model: label rate, dense means and Bayes AUC agree."""
    kwargs = dict(batch_size=8192, num_batches=4, **SMALL)
    host, dev = SyntheticCriteoDataset(**kwargs), SyntheticCriteoDataset(device="cpu", **kwargs)
    probs, labels, dense = [], [], []
    for i in range(4):
        batch, p = dev.batch_with_probabilities(i)
        probs.append(p.numpy())
        labels.append(batch.labels.numpy())
        dense.append(batch.dense_features.numpy())
    p_all = np.concatenate(probs)
    host_batch, host_p = host.batch_with_probabilities(0)
    assert abs(np.concatenate(labels).mean() - host_p.numpy().mean()) < 0.02
    np.testing.assert_allclose(
        np.concatenate(dense).mean(axis=0), host_batch.dense_features.numpy().mean(axis=0), rtol=0.1
    )
    assert abs(expected_auc(p_all, p_all) - host.bayes_optimal_auc(num_samples=1 << 15)) < 0.01


def test_datamodule_device_option_and_pinning() -> None:
    dm = SyntheticCriteo(batch_size=16, num_train_batches=2, device="cpu", **SMALL)
    batch = next(iter(dm.train_dataloader()))
    assert batch.sparse_features.length_per_key_or_none() is not None
    assert not dm.pins_memory()  # drawn on a device: nothing to pin
    with pytest.raises(ValueError, match="num_workers=0"):
        SyntheticCriteo(device="cuda", num_workers=2)
    host = SyntheticCriteo(batch_size=16, **SMALL)
    assert not host.pins_memory()  # no trainer attached
    for device, pinned in (("cuda", True), ("cpu", False)):
        host.trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device(device)))  # type: ignore[assignment]
        assert host.pins_memory() is pinned
    assert not SyntheticCriteo(pin_memory=False, **SMALL).pins_memory()


@pytest.mark.gpu
def test_cuda_batches_are_drawn_on_the_gpu_and_pinned_batches_copy_asynchronously() -> None:
    """Opt-in (-m gpu): device generation on CUDA, and Batch.to's default non-blocking copy."""
    ds = SyntheticCriteoDataset(batch_size=4096, num_batches=2, device="cuda", ids_per_feature=2, **SMALL)
    batch, probabilities = ds.batch_with_probabilities(1)
    kjt = batch.sparse_features
    assert batch.dense_features.is_cuda and kjt.values().is_cuda and kjt.lengths().is_cuda
    assert kjt.length_per_key_or_none() == [2 * 4096] * 26
    host = SyntheticCriteoDataset(batch_size=4096, num_batches=1, ids_per_feature=2, **SMALL)
    assert abs(float(probabilities.mean()) - float(host.batch_with_probabilities(0)[1].mean())) < 0.03
    pinned = host[0].pin_memory()
    moved = pinned.to("cuda")  # non_blocking=None: asynchronous from pinned memory
    torch.cuda.synchronize()
    assert torch.equal(moved.sparse_features.values().cpu(), pinned.sparse_features.values())
    assert torch.equal(moved.labels.cpu(), pinned.labels)
