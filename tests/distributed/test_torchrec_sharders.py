"""DistributedModelParallel shards a FusedEmbeddingBagCollection (its own fused optimizer) on 2 gloo
ranks like the unsharded one trains on every rank's samples."""

from __future__ import annotations

import torch

from lightrec import EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
from tests.multiprocess import run_ranks

TABLES = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=16, embedding_dim=4, feature_names=[f"f{i}"]) for i in range(3)]


def _fused() -> FusedEmbeddingBagCollection:
    torch.manual_seed(0)
    return FusedEmbeddingBagCollection(TABLES, fused_params={"optimizer": "sgd", "learning_rate": 0.5}, backend="torch")


def _kjt(rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(rank)
    lengths = torch.randint(1, 3, (6,), generator=g)
    return KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.randint(0, 16, (int(lengths.sum()),), generator=g),
                             lengths=lengths)  # fmt: skip


def _body(rank: int, world_size: int) -> dict:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.fused_embeddingbag import ShardedFusedEmbeddingBagCollection

    model = DistributedModelParallel(_fused(), device=torch.device("cpu"))
    assert isinstance(model.module, ShardedFusedEmbeddingBagCollection)
    out = model(_kjt(rank)).wait().values()
    out.square().sum().backward()
    full = model.gather_full_state_dict()
    return {"out": out.detach(), "tables": full}


def test_dmp_shards_a_fused_collection_with_its_optimizer() -> None:
    results = run_ranks(_body, world_size=2, timeout=240)
    ref = _fused()
    outs = [ref(_kjt(r)).values() for r in range(2)]
    (sum(o.square().sum() for o in outs) / 2).backward()  # one backward of the mean loss: one SGD update per row
    for r, res in enumerate(results):
        torch.testing.assert_close(res["out"], outs[r].detach())
        for name, value in ref.state_dict().items():
            torch.testing.assert_close(res["tables"][name], value, rtol=1e-5, atol=1e-6)
