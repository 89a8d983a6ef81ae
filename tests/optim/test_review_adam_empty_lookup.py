"""Fused Adam across a batch that looks up nothing in a table (review).

lightrec's fused Adam follows fbgemm (docs/kernels.md, ``lightrec.optim.fused_spec``): the step
counter ``t`` advances once per backward pass of the lookup module, also when a table got no ids,
and only rows a batch looks up (and their moments) change. A step with ids, a step without ids for
the table, a step with ids: the rows must equal that reference, with the bias correction of t = 3
in the third step. torch.optim.Adam on the plain (unconverted) module is dense Adam instead: the
unlooked rows still decay their moments and move, which the fused module does not do.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim import EmbOptimType, FusedOptimizerSpec, apply_optimizer_in_backward
from lightrec.sparse import KeyedJaggedTensor

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8


def _fbgemm_adam_reference(
    w: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, t: int, ids: list[int]
) -> None:
    """One step of fbgemm's Adam on ``w`` (float64) for a SUM loss: each looked-up row gets the
    gradient "number of its occurrences"; rows without ids keep their values and moments."""
    for r in sorted(set(ids)):
        g = torch.full_like(w[r], float(ids.count(r)))
        m1[r] = B1 * m1[r] + (1 - B1) * g
        m2[r] = B2 * m2[r] + (1 - B2) * g * g
        w[r] -= LR * (m1[r] / (1 - B1**t)) / ((m2[r] / (1 - B2**t)).sqrt() + EPS)


# Per step, per table, the bags of a batch of 2 samples ([] is a bag without ids).
_CASES = {
    # the second table gets no ids in step 2 while the first does (one kernel, one counter)
    "other_table_has_ids": [
        [[[1], [2]], [[0], [4]]],
        [[[1], [2]], [[], []]],
        [[[1], [3]], [[0], [4]]],
    ],
    # no table gets any id in step 2 (a batch of 2 samples whose bags are all empty)
    "no_ids_at_all": [
        [[[1], [2]], [[0], [4]]],
        [[[], []], [[], []]],
        [[[1, 1], [3]], [[0], [4]]],
    ],
}


@pytest.mark.parametrize("native", [True, False], ids=["native_update", "stock_op_update"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_fused_adam_step_with_an_empty_lookup_matches_fbgemm(
    case: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native:
        monkeypatch.setenv("LIGHTREC_CPU_UPDATE_NATIVE", "0")
    torch.manual_seed(0)
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=LR, beta1=B1, beta2=B2, eps=EPS)
    tables = [(6, 4), (5, 4)]
    module = BatchedEmbeddingBag(tables, [0, 1], PoolingType.SUM, optimizer=spec, kernel_backend="torch")
    if module.kernel.native_update != native:  # type: ignore[attr-defined]
        assert native, "LIGHTREC_CPU_UPDATE_NATIVE=0 did not select the stock-op update"
        pytest.skip("the native CPU update is not built in this environment")
    ref_w = [w.detach().double().clone() for w in module.split_embedding_weights()]
    ref_m1 = [torch.zeros_like(w) for w in ref_w]
    ref_m2 = [torch.zeros_like(w) for w in ref_w]
    for t, per_table in enumerate(_CASES[case], start=1):
        bags = [bag for table_bags in per_table for bag in table_bags]
        indices = torch.tensor([i for bag in bags for i in bag], dtype=torch.long)
        offsets = torch.tensor(
            [0, *torch.tensor([len(b) for b in bags]).cumsum(0).tolist()], dtype=torch.long
        )
        module(indices, offsets).sum().backward()
        for k, table_bags in enumerate(per_table):
            _fbgemm_adam_reference(ref_w[k], ref_m1[k], ref_m2[k], t, [i for bag in table_bags for i in bag])
        state = module.fused_optimizer.state_dict()["state"]
        for k, w in enumerate(module.split_embedding_weights()):
            torch.testing.assert_close(w.detach().double(), ref_w[k], atol=1e-6, rtol=0)
            torch.testing.assert_close(
                state[f"weights.t{k}"]["momentum1"].double(), ref_m1[k], atol=1e-6, rtol=0
            )
            torch.testing.assert_close(
                state[f"weights.t{k}"]["momentum2"].double(), ref_m2[k], atol=1e-8, rtol=0
            )
            assert int(state[f"weights.t{k}"]["step"]) == t  # once per backward, ids or not


def _kjt(bags: list[list[int]]) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        ["f"],
        torch.tensor([i for bag in bags for i in bag], dtype=torch.long),
        torch.tensor([len(b) for b in bags]),
    )


def test_plain_module_steps_dense_adam_the_fused_one_fbgemm_adam() -> None:
    """What the in-backward docstrings now say: before conversion torch.optim.Adam steps the whole
    weight (a row without ids still moves by its decaying moments), after it only looked-up rows move."""
    torch.manual_seed(0)
    plain = EmbeddingBagCollection(
        [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=6, feature_names=["f"])]
    )
    apply_optimizer_in_backward(torch.optim.Adam, plain.parameters(), {"lr": LR})
    fused = FusedEmbeddingBagCollection.from_module(plain, kernel_backend="torch")
    plain_w = plain.embedding_bags["t"].weight
    fused_w = fused.embedding_bags["t"].weight
    for m in (plain, fused):
        m(_kjt([[1], [2]])).values().sum().backward()
    torch.testing.assert_close(plain_w.detach(), fused_w.detach())  # every touched row agrees
    before_plain, before_fused = plain_w.detach().clone(), fused_w.detach().clone()
    for m in (plain, fused):
        m(_kjt([[], []])).values().sum().backward()  # no ids: a zero gradient everywhere
    torch.testing.assert_close(fused_w.detach(), before_fused, atol=0, rtol=0)  # fbgemm: untouched
    assert not torch.equal(plain_w.detach()[1], before_plain[1])  # dense Adam: row 1 moved
    torch.testing.assert_close(plain_w.detach()[0], before_plain[0], atol=0, rtol=0)  # never looked up: m = 0
