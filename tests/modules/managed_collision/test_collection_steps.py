"""What a managed-collision collection does once per step for all its tables: one range check of the
ids (a bad id still names its table), and one kernel call that resets the evicted rows of every
table (each row gets its own table's fresh values and a zero optimizer state)."""

from __future__ import annotations

import pytest
import torch

from lightrec import EmbeddingBagConfig, FusedEmbeddingBagCollection, KeyedJaggedTensor
from lightrec.modules.feature_checks import strict_checks
from lightrec.modules.managed_collision import (
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionIdError,
    MCHManagedCollisionModule,
    mix64_hash,
)
from lightrec.modules.managed_collision.reset import reinit_values

ROWS = 5  # 4 rows for ids + the default row 4


def configs(dims: tuple[int, ...] = (4, 8)) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=d, name=f"t{i}", feature_names=[f"f{i}"])
            for i, d in enumerate(dims)]  # fmt: skip


def collection(tables: list[EmbeddingBagConfig], **kwargs: object) -> ManagedCollisionCollection:
    modules = {t.name: MCHManagedCollisionModule(ROWS, "cpu", LRU_EvictionPolicy(), 3, input_hash_size=1000, **kwargs)  # type: ignore[arg-type]
               for t in tables}  # fmt: skip
    return ManagedCollisionCollection(modules, tables)


def kjt(*per_feature: list[int]) -> KeyedJaggedTensor:
    values = [i for ids in per_feature for i in ids]
    return KeyedJaggedTensor([f"f{i}" for i in range(len(per_feature))], torch.tensor(values),
                             lengths=torch.ones(len(values), dtype=torch.int64))  # fmt: skip


def test_a_bad_id_names_its_table_after_the_joint_check() -> None:
    mcc = collection(configs()).train()
    mcc(kjt([1, 2], [3, 4]))  # fine: one check for both tables
    with strict_checks():
        with pytest.raises(ManagedCollisionIdError, match="'t1'.*1000"):
            mcc(kjt([1, 2], [3, 1000]))
        with pytest.raises(ManagedCollisionIdError, match="'t0'.*-5"):
            mcc(kjt([-5, 2], [3, 4]))


def test_ids_outside_the_id_space_are_folded_into_it_by_default() -> None:
    """torchrec's modules take any raw id (its managed-collision notebook feeds ids above
    ``input_hash_size``); lightrec maps ``id mod input_hash_size`` in their place, with a warning."""
    folded, plain = collection(configs()).train(), collection(configs()).train()
    with pytest.warns(UserWarning, match="'t1' got raw ids outside \\[0, 1000\\).*set_strict_checks"):
        rows = folded(kjt([1, -5], [3, 2004])).values()
    assert torch.equal(rows, plain(kjt([1, 995], [3, 4])).values())


def test_ids_are_checked_after_the_input_hash() -> None:
    """With an ``input_hash_func`` the raw ids may be anything the hash maps into range."""
    mcc = collection(configs(), input_hash_func=mix64_hash).train()
    rows = mcc(kjt([-(2**40), 2**62], [5, 6])).values()
    assert bool((rows >= 0).all()) and bool((rows < ROWS).all())


def test_evicted_rows_of_every_table_are_reset_in_one_step() -> None:
    tables = configs((4, 8))
    ebc = FusedEmbeddingBagCollection(tables, fused_params={"optimizer": "ROWWISE_ADAGRAD", "learning_rate": 0.2})
    mc = ManagedCollisionEmbeddingBagCollection(ebc, collection(tables), return_remapped_features=True)

    def train(*per_feature: list[int]) -> list[int]:
        pooled, remapped = mc(kjt(*per_feature))
        pooled.values().pow(2).sum().backward()
        assert remapped is not None
        return remapped.values().tolist()

    rows = train([1, 2, 3, 4], [11, 12, 13, 14])  # fill both tables; 4 and 14 are the least recent at the round
    train([1, 2, 3], [11, 12, 13])
    train([1, 2, 3], [11, 12, 13])
    states = [s for lk in ebc._lookups for s in lk.kernel.split_optimizer_states()]
    assert all(bool((s["momentum1"][r] != 0).any()) for s, r in zip(states, (rows[3], rows[7]), strict=True))
    calls: list[int] = []
    real = ebc.reset_embedding_rows_uniform
    ebc.reset_embedding_rows_uniform = lambda resets: (calls.append(len(resets)), real(resets))  # type: ignore[method-assign]
    pooled, _ = mc(kjt([9], [19]))  # new ids take the rows of 4 and 14
    assert calls == [2]  # one call for both tables
    for t, (table, row) in enumerate(zip(tables, (rows[3], rows[7]), strict=True)):
        fresh = reinit_values(table, torch.tensor([row]), 4)[0]
        assert torch.equal(pooled.values()[0, sum(c.embedding_dim for c in tables[:t]) :][: table.embedding_dim], fresh)
    states = [s for lk in ebc._lookups for s in lk.kernel.split_optimizer_states()]
    assert all(bool((s["momentum1"][r] == 0).all()) for s, r in zip(states, (rows[3], rows[7]), strict=True))
    assert all(bool((s["momentum1"][0] != 0).any()) for s in states)  # other rows keep theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_drawn_in_the_kernel_equal_the_reinit_values_path(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused collection draws evicted rows' fresh values itself; a twin whose collection cannot
    (so ``reinit_values`` draws them and the kernels copy them in) ends with the same weights and state."""
    torch.manual_seed(0)
    tables = configs((4, 8))
    twins = []
    for _ in range(2):
        ebc = FusedEmbeddingBagCollection(tables, fused_params={"optimizer": "ADAGRAD", "learning_rate": 0.2},
                                          kernel_backend="torch").to(dtype)  # fmt: skip
        twins.append((ebc, ManagedCollisionEmbeddingBagCollection(ebc, collection(tables))))
    with torch.no_grad():
        for a, b in zip(twins[0][0].parameters(), twins[1][0].parameters(), strict=True):
            b.copy_(a)
    g = torch.Generator().manual_seed(1)
    for s in range(12):
        batch = kjt(*(torch.randint(0, 40 + 20 * s, (6,), generator=g).tolist() for _ in range(2)))
        for k, (ebc, mc) in enumerate(twins):
            with monkeypatch.context() as patch:
                if k == 1:  # the twin's collection has no in-kernel draw
                    patch.setattr(type(ebc), "reset_embedding_rows_uniform", None)
                pooled, _ = mc(batch)
            pooled.values().pow(2).sum().backward()
    assert twins[0][1]._managed_collision_collection.modules_by_table()["t0"].mc_stats()["evicted"] > 0
    for a, b in zip(twins[0][0].parameters(), twins[1][0].parameters(), strict=True):
        assert a.dtype == dtype and torch.equal(a, b)
    states = [[s for lk in ebc._lookups for s in lk.kernel.split_optimizer_states()] for ebc, _ in twins]
    for a, b in zip(*states, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
