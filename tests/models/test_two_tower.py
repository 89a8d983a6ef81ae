"""TwoTower / TwoTowerTrainTask against explicit towers and an in-batch softmax reference."""

import pytest
import torch
import torch.nn.functional as F

from lightrec.models import TwoTower, TwoTowerTrainTask
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor
from tests.models.helpers import FakeBatch, linears, reference_mlp, reference_pooled

NUM_USERS = NUM_ITEMS = 20


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="user_table", num_embeddings=NUM_USERS, embedding_dim=4, feature_names=["user"]),
        EmbeddingBagConfig(name="item_table", num_embeddings=NUM_ITEMS, embedding_dim=6, feature_names=["item", "genre"]),
    ]


def _kjt(users: torch.Tensor, items: torch.Tensor) -> KeyedJaggedTensor:
    """One user and one item per sample; ``genre`` is ``item % 4`` (missing for items divisible by 5)."""
    genre_lengths = (items % 5 != 0).long()
    genres = (items % 4)[genre_lengths.bool()]
    n = users.numel()
    return KeyedJaggedTensor(
        keys=["user", "item", "genre"],
        values=torch.cat([users, items, genres]),
        lengths=torch.cat([torch.ones(2 * n, dtype=torch.long), genre_lengths]),
    )


def _model(seed: int = 0, **kwargs) -> TwoTower:  # noqa: ANN003
    torch.manual_seed(seed)
    return TwoTower(EmbeddingBagCollection(_tables()), layer_sizes=[8, 5], **kwargs)


def test_towers_match_reference() -> None:
    model = _model()
    assert model.query_feature_names == ["user"] and model.candidate_feature_names == ["item", "genre"]
    kjt = _kjt(torch.tensor([0, 3, 7]), torch.tensor([5, 2, 11]))
    query, candidate = model(kjt)
    assert query.shape == candidate.shape == (3, 5)
    user, item, genre = reference_pooled(model.ebc, kjt)
    torch.testing.assert_close(query, reference_mlp(linears(model.query_proj), user, last_activation=False))
    torch.testing.assert_close(
        candidate, reference_mlp(linears(model.candidate_proj), torch.cat([item, genre], 1), last_activation=False)
    )
    assert linears(model.query_proj)[0].in_features == 4
    assert linears(model.candidate_proj)[0].in_features == 12


def test_explicit_and_partial_feature_split() -> None:
    torch.manual_seed(0)
    tables = _tables() + [EmbeddingBagConfig(name="ctx", num_embeddings=3, embedding_dim=2, feature_names=["hour"])]
    ebc = EmbeddingBagCollection(tables, device="meta")
    model = TwoTower(ebc, [4], query_feature_names=["user", "hour"])
    assert model.candidate_feature_names == ["item", "genre"]
    assert linears(model.query_proj)[0].in_features == 6
    model = TwoTower(ebc, [4], candidate_feature_names=["item"], device="cpu")
    assert model.query_feature_names == ["user", "genre", "hour"]
    for name, p in model.named_parameters():
        assert p.device.type == ("meta" if name.startswith("ebc.") else "cpu"), name
    with pytest.raises(ValueError, match="infer the query/candidate split from exactly two tables, got 3"):
        TwoTower(ebc, [4])
    with pytest.raises(ValueError, match=r"names unknown features \['usr'\]"):
        TwoTower(ebc, [4], query_feature_names=["usr"])
    with pytest.raises(ValueError, match=r"features \['item'\] are named for both towers"):
        TwoTower(ebc, [4], query_feature_names=["user", "item"], candidate_feature_names=["item"])
    with pytest.raises(ValueError, match="the candidate tower has no features"):
        TwoTower(ebc, [4], query_feature_names=["user", "item", "genre", "hour"])
    with pytest.raises(TypeError, match="got the string 'user'"):
        TwoTower(ebc, [4], query_feature_names="user")
    with pytest.raises(ValueError, match="layer_sizes must name at least one"):
        TwoTower(ebc, [], query_feature_names=["user"])


def test_normalize_gives_unit_embeddings() -> None:
    query, candidate = _model(normalize=True)(_kjt(torch.tensor([1, 2]), torch.tensor([3, 4])))
    torch.testing.assert_close(query.norm(dim=1), torch.ones(2))
    torch.testing.assert_close(candidate.norm(dim=1), torch.ones(2))


def test_train_task_is_in_batch_softmax() -> None:
    task = TwoTowerTrainTask(_model(), temperature=0.5)
    users, items = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7])
    batch = FakeBatch(torch.zeros(4, 0), _kjt(users, items), torch.ones(4))
    loss, (loss_d, logits, targets) = task(batch)
    query, candidate = task.two_tower(batch.sparse_features)
    expected_logits = query @ candidate.t() / 0.5
    torch.testing.assert_close(logits, expected_logits.detach())
    assert logits.shape == (4, 4) and torch.equal(targets, torch.arange(4))
    # row i: -log softmax(logits[i])[i], averaged
    expected = -torch.stack([expected_logits[i].log_softmax(0)[i] for i in range(4)]).mean()
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad and not loss_d.requires_grad and not logits.requires_grad
    # labels <= 0 drop those rows as queries; they stay in the softmax as negatives
    masked, _ = task(FakeBatch(None, batch.sparse_features, torch.tensor([1.0, 0.0, 1.0, 0.0])))
    per_row = F.cross_entropy(expected_logits, torch.arange(4), reduction="none")
    torch.testing.assert_close(masked, (per_row[0] + per_row[2]) / 2)
    no_labels, _ = task(FakeBatch(None, batch.sparse_features, None))
    torch.testing.assert_close(no_labels, expected)
    none_positive, _ = task(FakeBatch(None, batch.sparse_features, torch.zeros(4)))
    assert none_positive.item() == 0.0 and none_positive.requires_grad


def test_train_task_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="temperature must be a number > 0, got 0"):
        TwoTowerTrainTask(_model(), temperature=0)
    with pytest.raises(TypeError, match="two_tower must be an nn.Module"):
        TwoTowerTrainTask(None)
    task = TwoTowerTrainTask(_model())
    kjt = _kjt(torch.tensor([0, 1]), torch.tensor([2, 3]))
    with pytest.raises(ValueError, match=r"batch.labels must have shape \[B\] = \[2\], got \(3,\)"):
        task(FakeBatch(None, kjt, torch.ones(3)))


def _liked_item(users: torch.Tensor) -> torch.Tensor:
    return (3 * users + 1) % NUM_ITEMS


def _recall_at_1(model: TwoTower) -> float:
    users = torch.arange(NUM_USERS)
    with torch.no_grad():
        query, candidate = model(_kjt(users, _liked_item(users)))
    return (torch.argmax(query @ candidate.t(), dim=1) == users).float().mean().item()


def _train(steps: int = 60) -> tuple[list[float], float, float]:
    torch.manual_seed(4)
    model = TwoTower(EmbeddingBagCollection(_tables()), layer_sizes=[16, 8])
    task = TwoTowerTrainTask(model, temperature=0.3)
    opt = torch.optim.Adam(task.parameters(), lr=0.02)
    before = _recall_at_1(model)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        users = torch.randperm(NUM_USERS, generator=g)[:16]  # distinct users: no false negatives
        loss, _ = task(FakeBatch(None, _kjt(users, _liked_item(users)), torch.ones(16)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, before, _recall_at_1(model)


def test_training_learns_user_item_pairs_deterministically() -> None:
    losses, before, after = _train()
    assert sum(losses[-5:]) < 0.1 * sum(losses[:5]), losses
    assert before < 0.3 and after >= 0.9, (before, after)
    assert _train() == (losses, before, after)


def test_fx_symbolic_trace() -> None:
    model = _model()
    kjt = _kjt(torch.tensor([0, 3, 7]), torch.tensor([5, 2, 11]))
    traced = torch.fx.symbolic_trace(model)
    for got, want in zip(traced(kjt), model(kjt), strict=True):
        torch.testing.assert_close(got, want)
