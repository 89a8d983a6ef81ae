"""A torchrec DLRM training script moved to lightrec by replacing the word ``torchrec``.

Every ``lightrec`` import below was a ``torchrec`` import in the original script (same module
path, same name) except one: torchrec's ``torchrec.datasets.utils.Batch`` is ``lightrec.data.Batch``
(lightrec's data room has another layout). Nothing else changed. docs/migrating-from-torchrec.md walks through it, and
tests/docs/test_migration_example.py runs it on 2 gloo ranks.

Run (2 processes on CPU)::

    torchrun --nproc_per_node 2 docs/examples/torchrec_dlrm_migrated.py
"""

import os

import torch
import torch.distributed as dist

from lightrec.data import Batch  # torchrec: from torchrec.datasets.utils import Batch
from lightrec.distributed import DistributedModelParallel
from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
from lightrec.distributed.sharding_plan import get_default_sharders
from lightrec.models.dlrm import DLRM, DLRMTrain
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.optimizers import in_backward_optimizer_filter
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

NUM_EMBEDDINGS, EMBEDDING_DIM, DENSE_IN, BATCH = 1000, 16, 13, 64
FEATURES = ["cat_0", "cat_1", "cat_2", "cat_3"]


def synthetic_batch(step: int, rank: int) -> Batch:
    """A random Criteo-like batch (one id per feature) whose label depends on ``cat_0``."""
    g = torch.Generator().manual_seed(10_000 * rank + step)
    ids = torch.randint(0, NUM_EMBEDDINGS, (len(FEATURES), BATCH), generator=g)
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=ids.flatten(), lengths=torch.ones(len(FEATURES) * BATCH, dtype=torch.int32)
    )
    dense = torch.randn(BATCH, DENSE_IN, generator=g)
    labels = (ids[0] % 2 == 0).float()
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels)


def train(steps: int = 30) -> list[float]:
    """Train on this process's rank; returns the loss of every step."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=EMBEDDING_DIM, num_embeddings=NUM_EMBEDDINGS, feature_names=[f])
        for f in FEATURES
    ]
    model = DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=DENSE_IN,
            dense_arch_layer_sizes=[32, EMBEDDING_DIM],
            over_arch_layer_sizes=[32, 1],
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": 0.05})
    planner = EmbeddingShardingPlanner(
        topology=Topology(local_world_size=world_size, world_size=world_size, compute_device=device.type)
    )
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=model, device=device, plan=plan)
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=0.05),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])
    losses = []
    for step in range(steps):
        loss, (_, _logits, _labels) = model(synthetic_batch(step, rank))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    losses = train()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"first loss {losses[0]:.4f}, last loss {losses[-1]:.4f}")
    dist.destroy_process_group()
