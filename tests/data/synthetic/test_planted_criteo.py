"""Synthetic Criteo-like data: determinism, sharding, id distribution, planted signal."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lightrec.data import (
    CRITEO_KAGGLE_CARDINALITIES,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    SyntheticCriteoDataset,
    concat_batches,
    rank_dataloader,
    resolve_cardinalities,
    table_configs,
)
from lightrec.data.hashing import bounded_zipf, coprime_multiplier, exact_auc, expected_auc

SMALL = dict(num_embeddings_cap=5000)


def _same(a, b) -> None:  # noqa: ANN001
    torch.testing.assert_close(a.dense_features, b.dense_features, rtol=0, atol=0)
    torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)
    assert a.sparse_features.keys() == b.sparse_features.keys()
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())


def test_names_and_cardinalities() -> None:
    assert (
        DEFAULT_INT_NAMES[0] == "int_0" and DEFAULT_INT_NAMES[-1] == "int_12" and len(DEFAULT_INT_NAMES) == 13
    )
    assert (
        DEFAULT_CAT_NAMES[0] == "cat_0" and DEFAULT_CAT_NAMES[-1] == "cat_25" and len(DEFAULT_CAT_NAMES) == 26
    )
    assert sum(CRITEO_KAGGLE_CARDINALITIES) == 33762577  # the Kaggle data's total distinct values
    assert resolve_cardinalities("kaggle", num_embeddings_cap=1000)[:3] == [1000, 583, 1000]
    assert resolve_cardinalities("1tb", scale=0.001)[5] == 1  # ceil(3 * 0.001)
    assert resolve_cardinalities([10] * 26, scale=0.5) == [5] * 26
    with pytest.raises(ValueError, match="'kaggle', '1tb'"):
        resolve_cardinalities("avazu")
    with pytest.raises(ValueError, match="26 positive ints"):
        resolve_cardinalities([5, 5])
    for cap in (1.5, True, 0):  # a float cap made float table sizes
        with pytest.raises(ValueError, match="num_embeddings_cap must be a positive int or None"):
            resolve_cardinalities("kaggle", num_embeddings_cap=cap)
    assert resolve_cardinalities("kaggle", num_embeddings_cap=np.int64(1000))[0] == 1000
    cfgs = table_configs(16, resolve_cardinalities("kaggle", num_embeddings_cap=100))
    assert [c.name for c in cfgs[:2]] == ["t_cat_0", "t_cat_1"] and cfgs[3].feature_names == ["cat_3"]
    assert cfgs[8].num_embeddings == 3 and all(c.embedding_dim == 16 for c in cfgs)


def test_batch_layout_and_id_ranges() -> None:
    ds = SyntheticCriteoDataset(batch_size=64, num_batches=3, **SMALL)
    b = ds[1]
    sizes = ds.num_embeddings_per_feature
    assert b.dense_features.shape == (64, 13) and b.dense_features.dtype == torch.float32
    assert bool((b.dense_features >= 0).all())  # log1p of positive counts
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0}
    kjt = b.sparse_features
    assert kjt.keys() == DEFAULT_CAT_NAMES and kjt.stride() == 64
    for f, key in enumerate(DEFAULT_CAT_NAMES):
        v = kjt[key].values()
        assert v.numel() == 64 and int(v.min()) >= 0 and int(v.max()) < sizes[f]
    with pytest.raises(IndexError, match="out of range for 3 batches"):
        ds[3]


def test_deterministic_by_seed_and_split() -> None:
    a = SyntheticCriteoDataset(batch_size=32, num_batches=4, seed=7, **SMALL)
    b = SyntheticCriteoDataset(batch_size=32, num_batches=4, seed=7, **SMALL)
    _same(a[2], b[2])
    _same(a[3], a[3])
    other_seed = SyntheticCriteoDataset(batch_size=32, num_batches=4, seed=8, **SMALL)[2]
    assert not torch.equal(a[2].sparse_features.values(), other_seed.sparse_features.values())
    val = SyntheticCriteoDataset(batch_size=32, num_batches=4, seed=7, split="val", **SMALL)[2]
    assert not torch.equal(a[2].dense_features, val.dense_features)
    with pytest.raises(ValueError, match="split must be one of"):
        SyntheticCriteoDataset(split="dev")


def test_same_batches_for_any_worker_count() -> None:
    ds = SyntheticCriteoDataset(batch_size=16, num_batches=5, **SMALL)
    single = list(rank_dataloader(ds, num_workers=0))
    multi = list(rank_dataloader(ds, num_workers=2))
    assert len(single) == len(multi) == 5
    for x, y in zip(single, multi, strict=True):
        _same(x, y)


def test_block_size_makes_batches_composable() -> None:
    # Two ranks with B=16 at one step == one rank with B=32: the basis of "N ranks == 1 rank" tests.
    small = SyntheticCriteoDataset(batch_size=16, num_batches=4, block_size=16, **SMALL)
    big = SyntheticCriteoDataset(batch_size=32, num_batches=2, block_size=16, **SMALL)
    _same(concat_batches([small[2], small[3]]), big[1])
    with pytest.raises(ValueError, match="block_size must divide"):
        SyntheticCriteoDataset(batch_size=32, block_size=12)


@pytest.mark.parametrize(("world_size", "shuffle"), [(2, False), (3, True)])
def test_ranks_get_disjoint_batches(world_size: int, shuffle: bool) -> None:
    ds = SyntheticCriteoDataset(batch_size=8, num_batches=10, **SMALL)
    per_rank = [
        list(rank_dataloader(ds, r, world_size, shuffle=shuffle, seed=3).sampler) for r in range(world_size)
    ]
    steps = 10 // world_size
    assert all(len(ix) == steps for ix in per_rank)  # equal steps: no rank waits in a collective
    flat = list(itertools.chain.from_iterable(per_rank))
    assert len(set(flat)) == len(flat) == steps * world_size
    if not shuffle:
        assert per_rank[0] == [0, 2, 4, 6, 8] and per_rank[1] == [1, 3, 5, 7, 9]
    loader = rank_dataloader(ds, 1, world_size, shuffle=shuffle, seed=3)
    _same(next(iter(loader)), ds[per_rank[1][0]])
    with pytest.raises(ValueError, match="rank must be in"):
        rank_dataloader(ds, 2, 2)


def test_shuffle_changes_with_epoch_not_with_rank() -> None:
    ds = SyntheticCriteoDataset(batch_size=8, num_batches=20, **SMALL)
    sampler = rank_dataloader(ds, 0, 1, shuffle=True, seed=1).sampler
    e0 = list(sampler)
    sampler.set_epoch(1)
    e1 = list(sampler)
    assert sorted(e0) == sorted(e1) == list(range(20)) and e0 != e1


def test_zipf_ids_are_power_law_and_scattered() -> None:
    u = np.random.default_rng(0).random(200_000)
    ranks = bounded_zipf(u, 1000, 1.2)
    counts = np.bincount(ranks, minlength=1000)
    # P(r) ~ (r+1)^-1.2: rank 0 vs rank 9 differ by about 10^1.2 ~ 15.8
    ratio = counts[0] / counts[9]
    assert 11 < ratio < 22, ratio
    assert counts[0] > counts[10] > counts[100] > 0
    assert np.abs(np.bincount(bounded_zipf(u, 10, 0.0), minlength=10) / 20_000 - 1).max() < 0.05
    a, b = coprime_multiplier(1000, seed=0, stream=3)
    assert sorted((np.arange(1000) * a + b) % 1000) == list(range(1000))  # a permutation


def test_multi_hot_fixed_and_poisson() -> None:
    fixed = SyntheticCriteoDataset(batch_size=50, num_batches=1, ids_per_feature=3, **SMALL)[0]
    assert fixed.sparse_features.lengths().unique().tolist() == [3]
    per_feature = [0] * 13 + [2] * 13
    pois = SyntheticCriteoDataset(
        batch_size=400, num_batches=1, ids_per_feature=per_feature, ids_distribution="poisson", **SMALL
    )[0]
    lengths = pois.sparse_features.lengths().view(26, 400)
    assert int(lengths[:13].sum()) == 0  # mean 0: empty bags only
    assert abs(float(lengths[13:].float().mean()) - 2.0) < 0.15 and int(lengths[13:].min()) == 0
    with pytest.raises(ValueError, match="ids_distribution"):
        SyntheticCriteoDataset(ids_distribution="uniform")


def test_labels_follow_the_planted_logistic_model() -> None:
    ds = SyntheticCriteoDataset(batch_size=256, num_batches=2, ids_per_feature=2, **SMALL)
    b, p = ds.batch_with_probabilities(1)
    m = ds.model
    # Recompute the logit from the batch alone (dense -> z, ids -> hashed effects) and compare.
    z = (np.log(np.expm1(b.dense_features.double().numpy())) - m.dense_mu) / m.dense_sigma
    logit = m.bias + z @ m.dense_weight
    for f, key in enumerate(DEFAULT_CAT_NAMES):
        ids = b.sparse_features[key].values().numpy().reshape(256, 2)
        logit = logit + m.id_effect(f, ids).mean(axis=1)
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), p.numpy(), rtol=1e-4, atol=1e-5)


def test_expected_auc_matches_bruteforce() -> None:
    rng = np.random.default_rng(0)
    s = np.round(rng.random(60), 1)  # ties on purpose
    y = (rng.random(60) < 0.4).astype(float)
    pos, neg = s[y == 1], s[y == 0]
    brute = np.mean([(a > c) + 0.5 * (a == c) for a in pos for c in neg])
    assert exact_auc(s, y) == pytest.approx(brute)
    p = rng.random(12)
    num = sum(
        p[i] * (1 - p[j]) * ((s[i] > s[j]) + 0.5 * (s[i] == s[j]))
        for i in range(12)
        for j in range(12)
        if i != j
    )
    den = sum(p[i] * (1 - p[j]) for i in range(12) for j in range(12) if i != j)
    assert expected_auc(s[:12], p) == pytest.approx(num / den)


def test_planted_signal_is_learnable_and_bayes_auc_is_right() -> None:
    ds = SyntheticCriteoDataset(batch_size=4096, num_batches=6, split="test", num_embeddings_cap=2000)
    bayes = ds.bayes_optimal_auc(num_samples=1 << 16)
    assert 0.75 < bayes < 0.92
    probs, labels, dense_only = [], [], []
    for i in range(6):
        b, p = ds.batch_with_probabilities(i)
        probs.append(p)
        labels.append(b.labels)
        dense_only.append(b.dense_features.double().numpy() @ ds.model.dense_weight)
    y = torch.cat(labels).numpy()
    auc_true = exact_auc(torch.cat(probs).numpy(), y)
    assert abs(auc_true - bayes) < 0.01  # realised AUC of the true probabilities ~ the Bayes AUC
    assert 0.5 + 0.02 < exact_auc(np.concatenate(dense_only), y) < auc_true  # partial signal: less
    assert 0.15 < y.mean() < 0.5  # Criteo-like click rate
    assert ds.bayes_optimal_auc(num_samples=1 << 16) == bayes  # deterministic


def test_generation_is_fast() -> None:
    import time

    ds = SyntheticCriteoDataset(batch_size=2048, num_batches=5, num_embeddings_cap=100_000)
    ds[0]
    t = time.perf_counter()
    for i in range(1, 5):
        ds[i]
    per_batch = (time.perf_counter() - t) / 4
    assert per_batch < 0.1, f"{per_batch * 1e3:.1f} ms per batch of 2048"  # ~8 ms on one core


def test_a_small_model_learns_most_of_the_planted_signal() -> None:
    # Per-id logistic weights (EmbeddingBag of dim 1) + a tiny MLP on the dense features, trained on
    # 60k samples: it closes most of the gap between 0.5 and the Bayes AUC. A DLRM has a superset
    # of this model's capacity.
    torch.manual_seed(0)
    kw = dict(num_embeddings_cap=2000)
    train = SyntheticCriteoDataset(batch_size=1024, num_batches=60, **kw)
    test = SyntheticCriteoDataset(batch_size=4096, num_batches=4, split="test", **kw)
    embs = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(n, 1, mode="sum") for n in train.num_embeddings_per_feature
    )
    for e in embs:
        torch.nn.init.zeros_(e.weight)
    dense = torch.nn.Sequential(torch.nn.Linear(13, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adagrad([*embs.parameters(), *dense.parameters()], lr=0.2)

    def forward(b) -> torch.Tensor:  # noqa: ANN001
        out = dense(b.dense_features).squeeze(1)
        for key, emb in zip(b.sparse_features.keys(), embs, strict=True):
            jt = b.sparse_features[key]
            out = out + emb(jt.values(), jt.offsets()[:-1].long()).squeeze(1)
        return out

    for i in range(len(train)):
        b = train[i]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(forward(b), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        batches = [test[i] for i in range(len(test))]
        scores = torch.cat([forward(b) for b in batches]).numpy()
    auc = exact_auc(scores, torch.cat([b.labels for b in batches]).numpy())
    bayes = train.bayes_optimal_auc(num_samples=1 << 16)
    assert (auc - 0.5) / (bayes - 0.5) > 0.65, (auc, bayes)
