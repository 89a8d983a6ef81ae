"""A torchrec-trained DLRM's ``state_dict`` loads into lightrec's DLRM of the same config, unsharded
and (its full-table form) into a 2-rank model-parallel DLRM, with equal outputs.

The torchrec state dict is built here from a written description of torchrec's key layout (the
same table is in docs/migrating-from-torchrec.md), not by importing torchrec::

    sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight   [rows, D]
    dense_arch.model._mlp.<i>._linear.weight / .bias                     Perceptron i of the bottom MLP
    inter_arch.crossnet.W_kernels.<l> [N, r] / V_kernels.<l> [r, N] / bias.<l> [N, 1]   (DLRM_DCN only)
    over_arch.model.0._mlp.<i>._linear.weight / .bias                    top MLP but its last layer
    over_arch.model.1.weight / .bias                                     last layer (no activation)

The reference forward below reads those tensors directly (the DLRM paper's formulas).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from tests.models.helpers import random_kjt, tables
from tests.multiprocess import run_ranks

DENSE_IN, D, DENSE_SIZES, OVER_SIZES, DCN_LAYERS, DCN_RANK = 3, 4, [6, 4], [7, 1], 2, 3


def torchrec_dlrm_layout(dcn: bool) -> dict[str, list[int]]:
    """``{key: shape}`` of torchrec's DLRM / DLRM_DCN on ``tables(D)`` (features f0, f1 -> t0; f2 -> t1)."""
    layout = {
        "sparse_arch.embedding_bag_collection.embedding_bags.t0.weight": [20, D],
        "sparse_arch.embedding_bag_collection.embedding_bags.t1.weight": [10, D],
    }
    sizes = [DENSE_IN, *DENSE_SIZES]
    for i in range(len(DENSE_SIZES)):
        layout[f"dense_arch.model._mlp.{i}._linear.weight"] = [sizes[i + 1], sizes[i]]
        layout[f"dense_arch.model._mlp.{i}._linear.bias"] = [sizes[i + 1]]
    features = 3
    n = (features + 1) * D
    if dcn:
        for layer in range(DCN_LAYERS):
            layout[f"inter_arch.crossnet.W_kernels.{layer}"] = [n, DCN_RANK]
            layout[f"inter_arch.crossnet.V_kernels.{layer}"] = [DCN_RANK, n]
            layout[f"inter_arch.crossnet.bias.{layer}"] = [n, 1]
    over_in = n if dcn else D + features * (features + 1) // 2
    sizes = [over_in, *OVER_SIZES]
    for i in range(len(OVER_SIZES) - 1):
        layout[f"over_arch.model.0._mlp.{i}._linear.weight"] = [sizes[i + 1], sizes[i]]
        layout[f"over_arch.model.0._mlp.{i}._linear.bias"] = [sizes[i + 1]]
    layout["over_arch.model.1.weight"] = [sizes[-1], sizes[-2]]
    layout["over_arch.model.1.bias"] = [sizes[-1]]
    return layout


def torchrec_state_dict(dcn: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) * 0.3 for k, shape in torchrec_dlrm_layout(dcn).items()}


def reference_forward(state: dict[str, torch.Tensor], dense: torch.Tensor, kjt: Any, dcn: bool) -> torch.Tensor:
    def mlp(prefix: str, x: torch.Tensor, layers: int) -> torch.Tensor:
        for i in range(layers):
            x = torch.relu(x @ state[f"{prefix}._mlp.{i}._linear.weight"].t() + state[f"{prefix}._mlp.{i}._linear.bias"])
        return x

    x = mlp("dense_arch.model", dense, len(DENSE_SIZES))
    tables_of = {"f0": "t0", "f1": "t0", "f2": "t1"}
    pooled = []
    for feature in ("f0", "f1", "f2"):
        weight = state[f"sparse_arch.embedding_bag_collection.embedding_bags.{tables_of[feature]}.weight"]
        pooled.append(torch.stack([weight[ids].sum(0) for ids in kjt[feature].to_dense()]))
    vectors = [x, *pooled]
    if dcn:
        x0 = torch.cat(vectors, dim=1).unsqueeze(2)
        xl = x0
        for layer in range(DCN_LAYERS):
            w, v = state[f"inter_arch.crossnet.W_kernels.{layer}"], state[f"inter_arch.crossnet.V_kernels.{layer}"]
            xl = x0 * (torch.matmul(w, torch.matmul(v, xl)) + state[f"inter_arch.crossnet.bias.{layer}"]) + xl
        z = xl.squeeze(2)
    else:
        pairs = [(vectors[i] * vectors[j]).sum(1, keepdim=True) for i, j in itertools.combinations(range(4), 2)]
        z = torch.cat([x, *pairs], dim=1)
    z = mlp("over_arch.model.0", z, len(OVER_SIZES) - 1)
    return z @ state["over_arch.model.1.weight"].t() + state["over_arch.model.1.bias"]


def lightrec_dlrm(dcn: bool, device: str = "cpu") -> Any:
    from lightrec.models import DLRM, DLRM_DCN
    from lightrec.modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables(D), device=device)
    if dcn:
        return DLRM_DCN(ebc, DENSE_IN, DENSE_SIZES, OVER_SIZES, dcn_num_layers=DCN_LAYERS, dcn_low_rank_dim=DCN_RANK)
    return DLRM(ebc, DENSE_IN, DENSE_SIZES, OVER_SIZES)


def inputs(batch: int, seed: int = 1) -> tuple[torch.Tensor, Any]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, DENSE_IN, generator=g), random_kjt(batch, g)


@pytest.mark.parametrize("dcn", [False, True])
def test_torchrec_dlrm_state_dict_loads_unsharded_with_equal_outputs(dcn: bool) -> None:
    state = torchrec_state_dict(dcn)
    model = lightrec_dlrm(dcn)
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    dense, kjt = inputs(6)
    torch.testing.assert_close(model(dense, kjt), reference_forward(state, dense, kjt, dcn))


def _sharded_body(rank: int, world_size: int, dcn: bool) -> float:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.types import ShardingPlan

    model = lightrec_dlrm(dcn, device="meta")
    ebc = model.sparse_arch.embedding_bag_collection
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
        ebc, {"t0": row_wise(), "t1": table_wise(rank=1)}, world_size=world_size)})  # fmt: skip
    dmp = DistributedModelParallel(model, device="cpu", plan=plan, sharders=[EmbeddingBagCollectionSharder()])
    state = torchrec_state_dict(dcn)
    dmp.load_state_dict(state)  # the full-table form: plain tensors under the unsharded keys
    dense, kjt = inputs(4 * world_size)
    expected = reference_forward(state, dense, kjt, dcn)
    lo = rank * 4
    from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

    local = KeyedJaggedTensor.from_jt_dict(
        {k: JaggedTensor.from_dense(kjt[k].to_dense()[lo : lo + 4]) for k in kjt.keys()}
    )  # this rank's samples
    out = dmp(dense[lo : lo + 4], local)
    return (out.detach() - expected[lo : lo + 4]).abs().max().item()


@pytest.mark.parametrize("dcn", [False, True])
def test_torchrec_full_table_state_dict_loads_into_two_rank_sharded_dlrm(dcn: bool) -> None:
    for err in run_ranks(_sharded_body, world_size=2, args=(dcn,)):
        assert err < 1e-5
