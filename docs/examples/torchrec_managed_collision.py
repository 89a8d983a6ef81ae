"""A torchrec managed-collision training script -- raw 64-bit ids whose vocabulary drifts -- moved
to lightrec by replacing the word ``torchrec``.

Production ids are hashes anywhere in ``[0, 2**63 - 1)``; new ones appear and old ones stop being
seen. A ``ManagedCollisionEmbeddingBagCollection`` puts an ``MCHManagedCollisionModule`` (LRU
eviction every ``EVICTION_INTERVAL`` steps) in front of each table, so that every live id has a
row of its own and the rows of ids that stopped being seen are handed to new ones. The collection
is sharded by ``DistributedModelParallel`` -- the user table row-wise (each rank owns whole
buckets of the id space), the item table table-wise -- and trained with fused row-wise Adagrad
(``apply_optimizer_in_backward``) for the tables and Adagrad for the dense layers.

The task is planted: every id carries a hidden bit (a hash of the id), and a user clicks an item
when their bits agree. The live vocabulary of each feature is a window of ``LIVE_IDS`` ids that
slides by ``DRIFT_PER_STEP`` ids a step, so over the run several times more distinct ids pass
through each table than it has rows: the tables fill up and evict. At the end the model is
evaluated (the id maps frozen) on the ids live now, which must have rows and be predicted well,
and on the ids of the first window, which were evicted and fall on the default rows.
tests/docs/test_migration_scripts.py runs it on 2 gloo ranks.

Run (2 processes on CPU)::

    torchrun --nproc_per_node 2 docs/examples/torchrec_managed_collision.py
"""

import os

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed import DistributedModelParallel
from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection
from lightrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    get_default_sharders,
    row_wise,
    table_wise,
)
from lightrec.distributed.types import ShardingPlan
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from lightrec.modules.mc_modules import (
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from lightrec.modules.mlp import MLP
from lightrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.optimizers import in_backward_optimizer_filter
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

FEATURES = ["user_id", "item_id"]
INPUT_HASH_SIZE = 2**63 - 1  # torchrec's default: any non-negative int64 is a valid raw id
ROWS, DIM, EVICTION_INTERVAL = 96, 16, 4
LIVE_IDS, DRIFT_PER_STEP, BATCH_SIZE, LEARNING_RATE = 48, 3, 128, 0.1
MULTIPLIER = 0x5DEECE66D1A2B3C5  # odd: k -> k * MULTIPLIER mod 2**63 spreads id numbers over the id space


def raw_ids(numbers: torch.Tensor, feature: int) -> torch.Tensor:
    """The 63-bit raw id of id number ``numbers`` of ``feature`` (distinct numbers, distinct ids)."""
    return ((numbers * 2 + feature) * MULTIPLIER) & (2**63 - 1)


def hidden_bits(ids: torch.Tensor) -> torch.Tensor:
    return (ids >> 29) & 1  # a bit of the id's hash: what the model has to learn per id


class ManagedCollisionRanker(nn.Module):
    """Click logit of a (user, item) pair from their managed-collision embeddings."""

    def __init__(self, mc_ebc: ManagedCollisionEmbeddingBagCollection, device: torch.device | None = None) -> None:
        super().__init__()
        self.mc_ebc = mc_ebc
        self.over_arch = MLP(in_size=len(FEATURES) * DIM, layer_sizes=[32, 16], device=device)
        self.final = nn.Linear(16, 1, device=device)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        pooled, _ = self.mc_ebc(kjt)  # (KeyedTensor [B, 2 * DIM], None): return_remapped_features=False
        return self.final(self.over_arch(torch.cat([pooled[f] for f in FEATURES], dim=1))).squeeze(1)


def make_model(table_device: torch.device) -> ManagedCollisionRanker:
    tables = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f])
              for f in FEATURES]
    mc_modules = {
        f"t_{f}": MCHManagedCollisionModule(
            zch_size=ROWS, device=table_device, eviction_policy=LRU_EvictionPolicy(),
            eviction_interval=EVICTION_INTERVAL, input_hash_size=INPUT_HASH_SIZE,
        )
        for f in FEATURES
    }
    mc_ebc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=tables, device=table_device),
        ManagedCollisionCollection(mc_modules, tables),
        return_remapped_features=False,
    )
    torch.manual_seed(0)  # the dense layers start the same on every rank
    return ManagedCollisionRanker(mc_ebc, device=torch.device("cpu"))


def batch(step: int, rank: int, first_live: int | None = None) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """``BATCH_SIZE`` (user, item) pairs drawn from the ids live at ``step`` (numbers ``first_live`` ..
    ``first_live + LIVE_IDS - 1``) and their clicks."""
    first = step * DRIFT_PER_STEP if first_live is None else first_live
    g = torch.Generator().manual_seed(1000 * step + rank)
    numbers = first + torch.randint(0, LIVE_IDS, (len(FEATURES), BATCH_SIZE), generator=g)
    users, items = raw_ids(numbers[0], 0), raw_ids(numbers[1], 1)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=torch.cat([users, items]), lengths=torch.ones(2 * BATCH_SIZE, dtype=torch.int32)
    )
    return kjt, (hidden_bits(users) == hidden_bits(items)).float()


def local_evictions(model: nn.Module) -> dict:
    """``{table: ids evicted so far from the rows this rank owns}`` (``stats()`` is lightrec's: the
    counters ``ManagedCollisionMonitor`` logs)."""
    return {table: int(stats["evicted"]) for module in model.modules()
            if isinstance(module, ShardedManagedCollisionCollection) for table, stats in module.stats().items()}


def evictions(model: nn.Module) -> int:
    """Ids evicted so far, over all ranks."""
    total = torch.tensor([float(sum(local_evictions(model).values()))])
    dist.all_reduce(total)
    return int(total.item())


def accuracy(model: nn.Module, step: int, rank: int, first_live: int) -> float:
    kjt, labels = batch(step, rank, first_live)
    with torch.no_grad():
        return float(((model(kjt) > 0).float() == labels).float().mean())


def train(steps: int = 40) -> dict:
    """Train on this process's rank; returns the per-step losses, the evictions and evaluations."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cpu")
    model = make_model(torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, model.mc_ebc.parameters(), {"lr": LEARNING_RATE})
    plan = ShardingPlan({"mc_ebc": construct_module_sharding_plan(
        model.mc_ebc, {"t_user_id": row_wise(), "t_item_id": table_wise(rank=world_size - 1)}, world_size=world_size,
    )})  # fmt: skip
    model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=get_default_sharders())
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])
    loss_fn = nn.BCEWithLogitsLoss()

    losses, evicted = [], []
    for step in range(steps):
        kjt, labels = batch(step, rank)
        loss = loss_fn(model(kjt), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        evicted.append(evictions(model))

    model.eval()  # the id maps freeze: no insertion, no eviction, unknown ids go to the default rows
    last_first_live = (steps - 1) * DRIFT_PER_STEP
    dense = {k: v.detach().clone() for k, v in model.named_parameters() if "over_arch" in k or "final" in k}
    return {
        "losses": losses,
        "evictions": evicted,
        "local_evictions": local_evictions(model),
        "live_accuracy": accuracy(model, steps, rank, last_first_live),
        "evicted_accuracy": accuracy(model, steps, rank, 0),
        "dense": dense,
    }


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    result = train()
    if int(os.environ.get("RANK", "0")) == 0:
        losses = result["losses"]
        print(f"loss {sum(losses[:5]) / 5:.4f} -> {sum(losses[-5:]) / 5:.4f}; {result['evictions'][-1]} ids evicted; "
              f"accuracy on live ids {result['live_accuracy']:.3f}, on evicted ids {result['evicted_accuracy']:.3f}")
    dist.destroy_process_group()
