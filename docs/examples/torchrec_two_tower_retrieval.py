"""A torchrec two-tower retrieval example -- training and its serving side -- moved to lightrec by
replacing the word ``torchrec``.

Training: user and item ids (``userId`` / ``movieId``, torchrec's MovieLens column names) feed one
``EmbeddingBagCollection``; a query tower and a candidate tower (MLPs) project the pooled
embeddings; the logit of a (user, item) pair is their dot product. The collection is sharded by
``DistributedModelParallel`` and trained with ``TrainPipelineSparseDist`` (fused row-wise Adagrad for
the tables, Adagrad for the towers). Serving (rank 0): the trained tables are gathered into an
unsharded model (``state_dict_gather``), the candidate tower embeds every item once, the tables are
quantized to int8 (``quantize_embeddings``), and a ``PredictModule`` turns a batch of user ids into
the top-k items by dot product -- the KNN lookup torchrec's example does with faiss, here a plain
``topk``. tests/docs/test_migration_scripts.py runs it on 2 gloo ranks.

The data is planted: a user likes the items whose id has the user's parity, so retrieval can be
checked (torchrec's example reads MovieLens 25M).

Run (2 processes on CPU)::

    torchrun --nproc_per_node 2 docs/examples/torchrec_two_tower_retrieval.py
"""

import itertools
import os

import torch
import torch.distributed as dist
from torch import nn

from lightrec.datasets.movielens import DEFAULT_RATINGS_COLUMN_NAMES
from lightrec.datasets.utils import Batch
from lightrec.distributed import DistributedModelParallel
from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
from lightrec.distributed.sharding_plan import get_default_sharders
from lightrec.distributed.train_pipeline import TrainPipelineSparseDist
from lightrec.inference.modules import PredictModule, quantize_embeddings
from lightrec.inference.state_dict_transform import state_dict_gather
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.modules.mlp import MLP
from lightrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.optimizers import in_backward_optimizer_filter
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

USER, ITEM = DEFAULT_RATINGS_COLUMN_NAMES[0], DEFAULT_RATINGS_COLUMN_NAMES[1]  # "userId", "movieId"
NUM_USERS, NUM_ITEMS, DIM, BATCH_SIZE, TOP_K = 64, 128, 16, 128, 10


class TwoTower(nn.Module):
    """Query and candidate towers over one collection (torchrec's retrieval example's model)."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, layer_sizes: list, device=None) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        self.ebc = embedding_bag_collection
        self._query_feature, self._candidate_feature = configs[0].feature_names[0], configs[1].feature_names[0]
        self.query_proj = MLP(in_size=configs[0].embedding_dim, layer_sizes=layer_sizes, device=device)
        self.candidate_proj = MLP(in_size=configs[1].embedding_dim, layer_sizes=layer_sizes, device=device)

    def forward(self, kjt: KeyedJaggedTensor) -> tuple:
        pooled = self.ebc(kjt)
        return self.query_proj(pooled[self._query_feature]), self.candidate_proj(pooled[self._candidate_feature])


class TwoTowerTrainTask(nn.Module):
    def __init__(self, two_tower: TwoTower) -> None:
        super().__init__()
        self.two_tower = two_tower
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> tuple:
        query, candidate = self.two_tower(batch.sparse_features)
        logits = (query * candidate).sum(dim=1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


def make_model(device: torch.device) -> TwoTower:
    tables = [
        EmbeddingBagConfig(name=f"t_{USER}", embedding_dim=DIM, num_embeddings=NUM_USERS, feature_names=[USER]),
        EmbeddingBagConfig(name=f"t_{ITEM}", embedding_dim=DIM, num_embeddings=NUM_ITEMS, feature_names=[ITEM]),
    ]
    torch.manual_seed(0)
    return TwoTower(EmbeddingBagCollection(tables=tables, device=device), layer_sizes=[32, DIM], device=device)


def batches(rank: int, steps: int):
    """(user, item, like) pairs: a user likes an item when their ids have the same parity."""
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        users = torch.randint(0, NUM_USERS, (BATCH_SIZE,), generator=g)
        items = torch.randint(0, NUM_ITEMS, (BATCH_SIZE,), generator=g)
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=[USER, ITEM], values=torch.cat([users, items]), lengths=torch.ones(2 * BATCH_SIZE, dtype=torch.int32)
        )
        yield Batch(dense_features=torch.zeros(BATCH_SIZE, 0), sparse_features=sparse, labels=(users % 2 == items % 2).long())


def _kjt(users: torch.Tensor, items: torch.Tensor) -> KeyedJaggedTensor:
    lengths = torch.cat([torch.ones(len(users), dtype=torch.int32) if len(users) else torch.zeros(len(items), dtype=torch.int32),
                         torch.ones(len(items), dtype=torch.int32) if len(items) else torch.zeros(len(users), dtype=torch.int32)])
    return KeyedJaggedTensor.from_lengths_sync(keys=[USER, ITEM], values=torch.cat([users, items]), lengths=lengths)


class RetrievalModule(PredictModule):
    """Serving: ``{"user_id": [B]}`` -> the ``TOP_K`` items of each user (scores and ids)."""

    def __init__(self, model: TwoTower, candidates: torch.Tensor) -> None:
        super().__init__(model)
        self.candidates = candidates  # [NUM_ITEMS, DIM], computed once from the trained candidate tower

    def predict_forward(self, batch: dict) -> dict:
        users = batch["user_id"]
        pooled = self.predict_module.ebc(_kjt(users, torch.empty(0, dtype=torch.int64)))
        query = self.predict_module.query_proj(pooled[USER])
        scores, ids = (query @ self.candidates.T).topk(TOP_K, dim=1)
        return {"scores": scores, "item_ids": ids}


def train_and_serve(steps: int = 60) -> dict:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    model = TwoTowerTrainTask(make_model(torch.device("meta")))
    apply_optimizer_in_backward(RowWiseAdagrad, model.two_tower.ebc.parameters(), {"lr": 0.1})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"), batch_size=BATCH_SIZE)
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=model, device=device, plan=plan)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=0.05))
    pipeline = TrainPipelineSparseDist(model, CombinedOptimizer([model.fused_optimizer, dense]), device)
    iterator = iter(batches(rank, steps))
    losses = []
    for _ in itertools.count():
        try:
            loss, _, _ = pipeline.progress(iterator)
        except StopIteration:
            break
        losses.append(loss.item())

    # ---- serving side: full tables on rank 0, candidate embeddings, int8 tables, top-k retrieval
    serving = make_model(device)
    destination = {f"two_tower.{k}": v for k, v in serving.state_dict().items()}
    state_dict_gather(model.state_dict(), destination)  # collective: every rank takes part
    out = {"losses": losses}
    if rank == 0:
        with torch.no_grad():
            items = torch.arange(NUM_ITEMS)
            pooled = serving.ebc(_kjt(torch.empty(0, dtype=torch.int64), items))
            candidates = serving.candidate_proj(pooled[ITEM])
            float_top = RetrievalModule(serving, candidates)({"user_id": torch.arange(NUM_USERS)})["item_ids"]
        quantized = quantize_embeddings(serving, dtype=torch.qint8, inplace=True)
        served = RetrievalModule(quantized, candidates)({"user_id": torch.arange(NUM_USERS)})["item_ids"]
        out["float_top_k"], out["served_top_k"] = float_top, served
    return out


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    result = train_and_serve()
    if int(os.environ.get("RANK", "0")) == 0:
        hits = (result["served_top_k"] % 2 == torch.arange(NUM_USERS).unsqueeze(1) % 2).float().mean()
        print(f"loss {result['losses'][0]:.3f} -> {result['losses'][-1]:.3f}; served items of the user's parity: {hits:.0%}")
    dist.destroy_process_group()
