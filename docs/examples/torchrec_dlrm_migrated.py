"""A torchrec DLRM training script moved to lightrec by replacing the word ``torchrec``.

Every ``lightrec`` import below is the ``torchrec`` import of the original script (same module
path, same name); nothing else changed. It uses what a torchrec DLRM example uses: the random
Criteo-shaped dataset of ``torchrec.datasets``, a planner with its own enumerator (and estimators)
and a heuristic storage reservation, fp16/bf16 quantized communication of the embeddings,
``DistributedModelParallel``, fused row-wise Adagrad for the tables (``apply_optimizer_in_backward``),
Adagrad for the dense part, ``TrainPipelineSparseDist`` and torchrec's metric module.
docs/migrating-from-torchrec.md walks through it; tests/docs/test_migration_example.py runs it on
2 gloo ranks and checks its per-step losses against lightrec's own ``RecStrategy`` path.

Run (2 processes on CPU)::

    torchrun --nproc_per_node 2 docs/examples/torchrec_dlrm_migrated.py
"""

import itertools
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from lightrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from lightrec.datasets.random import RandomRecDataset
from lightrec.distributed import DistributedModelParallel
from lightrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from lightrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from lightrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from lightrec.distributed.train_pipeline import TrainPipelineSparseDist
from lightrec.metrics.metric_module import RecMetricModule, generate_metric_module
from lightrec.metrics.metrics_config import (
    MetricsConfig,
    RecMetricDef,
    RecMetricEnum,
    RecTaskInfo,
    ThroughputDef,
)
from lightrec.models.dlrm import DLRM, DLRMTrain
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.optimizers import in_backward_optimizer_filter
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad

NUM_EMBEDDINGS, EMBEDDING_DIM, BATCH_SIZE, NUM_FEATURES = 500, 16, 64, 8
CAT_NAMES = DEFAULT_CAT_NAMES[:NUM_FEATURES]
LEARNING_RATE = 0.05


def get_dataloader(rank: int, num_batches: int) -> DataLoader:
    """torchrec's random DLRM data: one id per feature, labels 0/1, 13 dense features; five batches per
    rank, drawn once and cycled (torchrec's cache; something to learn)."""
    return DataLoader(
        RandomRecDataset(
            keys=CAT_NAMES,
            batch_size=BATCH_SIZE,
            hash_size=NUM_EMBEDDINGS,
            ids_per_feature=1,
            num_dense=len(DEFAULT_INT_NAMES),
            manual_seed=rank,
            num_batches=num_batches,
            num_generated_batches=5,
        ),
        batch_size=None,
        batch_sampler=None,
        num_workers=0,
    )


def build_model(device: torch.device) -> DLRMTrain:
    eb_configs = [
        EmbeddingBagConfig(name=f"t_{name}", embedding_dim=EMBEDDING_DIM, num_embeddings=NUM_EMBEDDINGS, feature_names=[name])
        for name in CAT_NAMES
    ]
    torch.manual_seed(0)
    return DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=eb_configs, device=torch.device("meta")),
            dense_in_features=len(DEFAULT_INT_NAMES),
            dense_arch_layer_sizes=[32, EMBEDDING_DIM],
            over_arch_layer_sizes=[32, 1],
            dense_device=device,
        )
    )


def sharders_with_qcomms() -> list:
    qcomm_codecs_registry = get_qcomm_codecs_registry(
        qcomms_config=QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)
    )
    return [EmbeddingBagCollectionSharder(qcomm_codecs_registry=qcomm_codecs_registry)]


def train(steps: int = 20) -> dict:
    """Train on this process's rank; returns the per-step losses, the metrics and the plan."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    model = build_model(device)
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": LEARNING_RATE, "eps": 1e-8})

    topology = Topology(local_world_size=world_size, world_size=world_size, compute_device=device.type)
    sharders = sharders_with_qcomms()
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=BATCH_SIZE,
        enumerator=EmbeddingEnumerator(
            topology=topology,
            batch_size=BATCH_SIZE,
            estimator=[EmbeddingPerfEstimator(topology=topology), EmbeddingStorageEstimator(topology=topology)],
        ),
        storage_reservation=HeuristicalStorageReservation(percentage=0.05),
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)

    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])
    task = RecTaskInfo(name="click", label_name="label", prediction_name="prediction", weight_name="weight")
    metrics = generate_metric_module(
        RecMetricModule,
        MetricsConfig(
            rec_tasks=[task],
            rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0], window_size=10 * BATCH_SIZE),
                         RecMetricEnum.AUC: RecMetricDef(rec_task_indices=[0])},
            throughput_metric=ThroughputDef(window_size=100, warmup_steps=2),
        ),
        batch_size=BATCH_SIZE,
        world_size=world_size,
        my_rank=rank,
        state_metrics_mapping={},
        device=device,
    )

    train_pipeline = TrainPipelineSparseDist(model, optimizer, device)
    iterator = iter(get_dataloader(rank, steps))
    losses = []
    for _ in itertools.count():
        try:
            loss, logits, labels = train_pipeline.progress(iterator)
        except StopIteration:
            break
        losses.append(loss.item())
        metrics.update({"prediction": torch.sigmoid(logits), "label": labels})
    return {"losses": losses, "metrics": {k: float(v) for k, v in metrics.compute().items()}, "plan": plan}


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    result = train()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"first loss {result['losses'][0]:.4f}, last loss {result['losses'][-1]:.4f}")
        print({k: round(v, 4) for k, v in result["metrics"].items()})
    dist.destroy_process_group()
