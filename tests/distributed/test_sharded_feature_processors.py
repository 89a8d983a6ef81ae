"""The sharded FeatureProcessedEmbeddingBagCollection on 2 gloo ranks, against the unsharded one fed
every rank's samples: outputs, position-weight gradients (summed over ranks), fused table updates,
torchrec's state-dict keys."""

from __future__ import annotations

import copy

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from tests.multiprocess import run_ranks

FEATURES = ["f0", "f1", "f2"]
ROWS = {"f0": 30, "f1": 40, "f2": 20}


def _fp_ebc(collection: bool) -> FeatureProcessedEmbeddingBagCollection:
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS[f], embedding_dim=8 if i != 1 else 4,
                                 feature_names=[f]) for i, f in enumerate(FEATURES)]  # fmt: skip
    processors = (PositionWeightedModuleCollection({f: 4 for f in FEATURES[:2]}) if collection
                  else {f: PositionWeightedModule(4) for f in FEATURES})  # fmt: skip
    fp = FeatureProcessedEmbeddingBagCollection(EmbeddingBagCollection(tables, is_weighted=True), processors)
    with torch.no_grad():
        for p in fp._feature_processors.parameters():
            p.copy_(torch.linspace(0.5, 2.0, p.numel()))
    return fp


def _kjt(rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(10 + rank)
    lengths = torch.randint(0, 5, (len(FEATURES) * 3,), generator=g)
    values = torch.cat([torch.randint(0, ROWS[f], (int(lengths[i * 3 : (i + 1) * 3].sum()),), generator=g)
                        for i, f in enumerate(FEATURES)])  # fmt: skip
    return KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)


def _scale(rank: int) -> torch.Tensor:
    return torch.randn(3, 20, generator=torch.Generator().manual_seed(20 + rank))


def _body(rank: int, world_size: int, collection: bool) -> dict:
    from lightrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from lightrec.distributed.sharding.state_dict import ShardedTableState
    from lightrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )
    from lightrec.distributed.types import ShardingEnv

    fp = _fp_ebc(collection)
    plan = construct_module_sharding_plan(
        fp, {"t0": table_wise(1), "t1": row_wise(), "t2": column_wise(ranks=[0, 1])}, world_size=world_size)  # fmt: skip
    sharder = FeatureProcessedEmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": 0.1},
                                                            kernel_backend="torch")  # fmt: skip
    sharded = sharder.shard(fp, plan, ShardingEnv.from_process_group(None), torch.device("cpu"))
    out = sharded(_kjt(rank)).wait()
    (out.values() * _scale(rank)).sum().backward()
    grads = {n: p.grad.clone() for n, p in sharded.named_parameters() if "_feature_processors" in n}
    state = sharded.state_dict()
    full = {k: (v.full_tensor_local() if isinstance(v, ShardedTableState) else v) for k, v in state.items()}
    for k, v in full.items():
        if k.startswith("_embedding_bag_collection"):
            torch.distributed.all_reduce(v)
    fresh = sharder.shard(_fp_ebc(collection), plan, ShardingEnv.from_process_group(None), torch.device("cpu"))
    fresh.load_state_dict(state)  # the same plan: this rank's shards load back under torchrec's keys
    with torch.no_grad():
        reloaded = fresh(_kjt(rank)).wait().values()
        trained = sharded(_kjt(rank)).wait().values()
    return {"out": out.values().detach(), "grads": grads, "tables": full, "reloaded": reloaded, "trained": trained,
            "keys": sorted(state)}  # fmt: skip


@pytest.mark.parametrize("collection", [False, True], ids=["dict", "collection"])
def test_sharded_fp_ebc_equals_unsharded(collection: bool) -> None:
    results = run_ranks(_body, world_size=2, args=(collection,), timeout=240)
    ref = _fp_ebc(collection)
    outs = [ref(_kjt(r)) for r in range(2)]
    loss = sum((o.values() * _scale(r)).sum() for r, o in enumerate(outs)) / 2  # the mean of the ranks' losses
    loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if "_feature_processors" in n}
    for r, res in enumerate(results):
        torch.testing.assert_close(res["out"], outs[r].values().detach())
        assert res["grads"].keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            torch.testing.assert_close(res["grads"][name], g, rtol=1e-5, atol=1e-6)
        for i in range(3):
            w = ref._embedding_bag_collection.embedding_bags[f"t{i}"].weight
            torch.testing.assert_close(res["tables"][f"_embedding_bag_collection.embedding_bags.t{i}.weight"],
                                       (w - 0.1 * w.grad).detach(), rtol=1e-5, atol=1e-6)  # fmt: skip
        torch.testing.assert_close(res["reloaded"], res["trained"])  # the same (updated) weights: the same output
        assert res["keys"] == sorted(copy.deepcopy(ref).state_dict())
