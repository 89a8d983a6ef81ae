"""torchrec's managed-collision import paths under ``lightrec`` (``sed s/torchrec/lightrec/``), and a
torchrec-style script -- torchrec's names and arguments -- that trains a managed-collision
``EmbeddingCollection`` with either module, unchanged."""

from __future__ import annotations

import importlib

import pytest
import torch

MC_PATHS: dict[str, list[str]] = {
    "torchrec.modules.mc_modules": [
        "ManagedCollisionModule", "MCHManagedCollisionModule", "ManagedCollisionCollection", "MCHEvictionPolicy",
        "MCHEvictionPolicyMetadataInfo", "LFU_EvictionPolicy", "LRU_EvictionPolicy", "DistanceLFU_EvictionPolicy",
        "apply_mc_method_to_jt_dict", "average_threshold_filter", "dynamic_threshold_filter",
        "probabilistic_threshold_filter",
    ],
    "torchrec.modules.mc_embedding_modules": [
        "BaseManagedCollisionEmbeddingCollection", "ManagedCollisionEmbeddingBagCollection",
        "ManagedCollisionEmbeddingCollection",
    ],
    "torchrec.modules.hash_mc_modules": ["HashZchManagedCollisionModule", "TrainInputMapper"],
    "torchrec.modules.hash_mc_evictions": [
        "HashZchEvictionConfig", "HashZchEvictionModule", "HashZchEvictionPolicyName", "get_kernel_from_policy",
    ],
    "torchrec.quant.embedding_modules": [
        "QuantManagedCollisionEmbeddingCollection", "QuantManagedCollisionEmbeddingBagCollection",
    ],
    "torchrec.distributed.mc_modules": [
        "ManagedCollisionCollectionSharder", "InferManagedCollisionCollectionSharder",
        "ShardedManagedCollisionCollection",
    ],
    "torchrec.distributed.mc_embeddingbag": [
        "ManagedCollisionEmbeddingBagCollectionSharder", "ShardedManagedCollisionEmbeddingBagCollection",
    ],
    "torchrec.distributed.mc_embedding": [
        "ManagedCollisionEmbeddingCollectionSharder", "ShardedManagedCollisionEmbeddingCollection",
    ],
    "torchrec.distributed.mc_embedding_modules": [
        "BaseManagedCollisionEmbeddingCollectionSharder", "BaseShardedManagedCollisionEmbeddingCollection",
    ],
    "torchrec.distributed.quant_embedding": ["QuantManagedCollisionEmbeddingCollectionSharder"],
    "torchrec.distributed": [
        "ManagedCollisionEmbeddingBagCollectionSharder", "ManagedCollisionEmbeddingCollectionSharder",
    ],
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(MC_PATHS))
def test_torchrec_mc_path_imports_under_lightrec(path: str) -> None:
    module = importlib.import_module(path.replace("torchrec", "lightrec"))
    missing = [name for name in MC_PATHS[path] if not hasattr(module, name)]
    assert not missing, f"{path} -> lightrec lacks {missing}"


def test_default_sharders_include_the_managed_collision_ones() -> None:
    from lightrec.distributed import get_default_sharders
    from lightrec.modules.mc_embedding_modules import (
        ManagedCollisionEmbeddingBagCollection,
        ManagedCollisionEmbeddingCollection,
    )

    types = {s.module_type for s in get_default_sharders()}
    assert {ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection} <= types


@pytest.mark.parametrize("kind", ["mch", "hash"])
def test_torchrec_style_script_trains_a_managed_collision_embedding_collection(kind: str) -> None:
    # The imports and calls of a torchrec script, with the word replaced.
    from lightrec.modules.embedding_configs import EmbeddingConfig
    from lightrec.modules.embedding_modules import EmbeddingCollection
    from lightrec.modules.hash_mc_modules import HashZchManagedCollisionModule
    from lightrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection
    from lightrec.modules.mc_modules import (
        DistanceLFU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )
    from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

    tables = [EmbeddingConfig(name="t_item", embedding_dim=8, num_embeddings=64, feature_names=["item"])]
    if kind == "mch":
        mc_module = MCHManagedCollisionModule(
            zch_size=64, device=torch.device("cpu"), eviction_interval=2,
            eviction_policy=DistanceLFU_EvictionPolicy(decay_exponent=1.0), input_hash_size=2**62,
        )  # fmt: skip
    else:
        mc_module = HashZchManagedCollisionModule(zch_size=64, device=torch.device("cpu"), total_num_buckets=1,
                                                  max_probe=16, input_hash_size=2**62)  # fmt: skip
    mc_ec = ManagedCollisionEmbeddingCollection(
        EmbeddingCollection(tables=tables, device=torch.device("cpu")),
        ManagedCollisionCollection({"t_item": mc_module}, tables),
        return_remapped_features=False,
    )
    opt = torch.optim.SGD(mc_ec.parameters(), lr=2.0)
    g = torch.Generator().manual_seed(0)
    items = torch.randint(0, 2**62, (20,), generator=g)
    target = torch.randn(20, 8, generator=g)
    losses = []
    for _ in range(30):
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=items, lengths=torch.ones(20, dtype=torch.int64))
        out, remapped = mc_ec(kjt)
        loss = (out["item"].values() - target).pow(2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert remapped is None and losses[-1] < 0.2 * losses[0]  # 20 ids, 64 rows: each id learns its own row
