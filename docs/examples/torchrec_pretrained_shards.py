"""A torchrec transfer-learning script -- pretrained embedding rows written into each rank's shards
-- moved to lightrec by replacing the word ``torchrec``.

``DistributedModelParallel.state_dict()`` gives every model-parallel table as this rank's shards
(torchrec: a ``ShardedTensor``; lightrec: a ``ShardedTableState`` with the same ``local_shards()`` /
``metadata()`` view). The script copies the matching block of each pretrained table into every
local shard in place -- no rank ever holds a whole table of the model -- and checks the sharded
model against an unsharded one holding the pretrained tables. The tables are sharded table-wise,
row-wise and column-wise. (The pretrained tables are drawn here; a real script loads them from
files.) tests/docs/test_migration_scripts.py runs it on 2 gloo ranks.

Run (2 processes on CPU)::

    torchrun --nproc_per_node 2 docs/examples/torchrec_pretrained_shards.py
"""

import os

import torch
import torch.distributed as dist

from lightrec.distributed import DistributedModelParallel
from lightrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from lightrec.distributed.types import ShardingPlan
from lightrec.models.dlrm import DLRM
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor

FEATURES = ["f_tw", "f_rw", "f_cw"]
NUM_EMBEDDINGS, DIM = 50, 8
PREFIX = "sparse_arch.embedding_bag_collection.embedding_bags"


def make_model(table_device: torch.device) -> DLRM:
    """Tables on ``table_device`` (``meta``: sharded later), the dense layers on the CPU."""
    tables = [EmbeddingBagConfig(name=f"t_{f}", num_embeddings=NUM_EMBEDDINGS, embedding_dim=DIM, feature_names=[f])
              for f in FEATURES]
    ebc = EmbeddingBagCollection(tables=tables, device=table_device)
    torch.manual_seed(0)  # after the tables: the dense layers start the same whether the tables are on meta or not
    return DLRM(embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[8, DIM],
                over_arch_layer_sizes=[8, 1], dense_device=torch.device("cpu"))


def pretrained_tables() -> dict:
    g = torch.Generator().manual_seed(42)
    return {f"{PREFIX}.t_{f}.weight": torch.randn(NUM_EMBEDDINGS, DIM, generator=g) for f in FEATURES}


def load_pretrained_shards() -> dict:
    world_size = dist.get_world_size()
    model = make_model(torch.device("meta"))
    ebc = model.sparse_arch.embedding_bag_collection
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
        ebc, {"t_f_tw": table_wise(rank=world_size - 1), "t_f_rw": row_wise(),
              "t_f_cw": column_wise(ranks=list(range(world_size)))}, world_size=world_size)})
    model = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan)

    pretrained = pretrained_tables()
    shards_written = 0
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key not in pretrained:
                continue
            if hasattr(value, "local_shards"):  # a model-parallel table: this rank's shards
                assert list(value.metadata().size) == list(pretrained[key].shape)
                for shard in value.local_shards():
                    (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(pretrained[key][row : row + rows, col : col + cols])
                    shards_written += 1
            else:  # a replicated (data-parallel) table
                value.copy_(pretrained[key])

    # The sharded model now computes what an unsharded model with the pretrained tables computes.
    reference = make_model(torch.device("cpu"))
    reference.load_state_dict({**reference.state_dict(), **pretrained})
    g = torch.Generator().manual_seed(dist.get_rank())
    lengths = torch.randint(0, 4, (len(FEATURES) * 6,), generator=g)
    kjt = KeyedJaggedTensor(keys=FEATURES, values=torch.randint(0, NUM_EMBEDDINGS, (int(lengths.sum()),), generator=g),
                            lengths=lengths)
    dense = torch.randn(6, 4, generator=g)
    with torch.no_grad():
        difference = (model(dense, kjt) - reference(dense, kjt)).abs().max().item()
    return {"shards_written": shards_written, "max_difference": difference,
            "all_shards": {k: len(v.metadata().shards_metadata) for k, v in model.state_dict().items() if k in pretrained}}


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    result = load_pretrained_shards()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {result['shards_written']} local shards; largest difference to the unsharded model: "
              f"{result['max_difference']:.2e}")
    dist.destroy_process_group()
