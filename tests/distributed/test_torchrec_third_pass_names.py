"""torchrec's distributed and planner names of issue 37, at torchrec's paths, each used the way
torchrec's callers use it on a small case: the topology helpers (also on 2 gloo ranks), the shard
layouts, the storage formulas against hand-computed bytes, an extension sharder (torchrec's
``shardable_parameters`` form, its own kernel behind ``GUARDED_COMPUTE_KERNELS``) with the
planner's ``SharderData``, plans from ``ShardingOption`` s and back, and a ``ShardedModule`` of
one's own."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist
from torch import nn

import lightrec.distributed  # noqa: F401 - registers the default sharders, as `import torchrec.distributed` does
from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.distributed.comm import get_group_rank, get_local_rank, get_local_size, get_num_groups
from lightrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from lightrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator
from lightrec.distributed.planner.types import PlannerError, ShardingOption
from lightrec.distributed.types import ModuleSharder
from tests.multiprocess import run_ranks

NAMES = {
    "lightrec.types": ["DataType", "CacheMixin", "CopyMixIn", "ModuleCopyMixin", "ModuleNoCopyMixin"],
    "lightrec.streamable": ["Pipelineable", "Multistreamable"],
    "lightrec.distributed.comm": ["get_local_size", "get_local_rank", "get_group_rank", "get_num_groups",
                                  "intra_and_cross_node_pg"],
    "lightrec.distributed.types": ["PipelineType", "ShardedModule", "BoundsCheckMode", "ShardedTensor", "CommOp",
                                   "StorageUsageType"],
    "lightrec.distributed.sharding_plan": ["placement", "apply_to_all", "get_module_to_default_sharders",
                                           "calculate_shard_sizes_and_offsets", "_calculate_rw_shard_sizes_and_offsets",
                                           "_calculate_cw_shard_sizes_and_offsets",
                                           "_calculate_grid_shard_sizes_and_offsets"],
    "lightrec.distributed.planner.constants": ["BIGINT_DTYPE", "POOLING_FACTOR", "UVM_CACHING_RATIO",
                                               "KV_CACHING_RATIO", "HBM_MEM_BW", "kernel_bw_lookup"],
    "lightrec.distributed.planner.enumerators": ["GUARDED_COMPUTE_KERNELS", "get_partition_by_type", "sharder_name"],
    "lightrec.distributed.planner.types": ["SharderData", "SharderDataMap"],
    "lightrec.distributed.planner.planners": ["to_sharding_plan", "extract_plan"],
    "lightrec.distributed.planner.shard_estimators": ["calculate_shard_storages", "calculate_pipeline_io_cost",
                                                      "get_num_poolings"],
    "lightrec.distributed.planner.utils": ["build_sharder_data", "build_sharder_data_map", "BinarySearchPredicate",
                                           "bytes_to_gb", "prod", "storage_repr_in_gb", "reset_shard_rank"],
    "lightrec.distributed.planner.estimator.types": ["HardwarePerfConfig", "ShardPerfContext"],
}  # fmt: skip
_TOPOLOGY_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                  "LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")  # fmt: skip


@pytest.mark.parametrize("path", sorted(NAMES))
def test_each_name_imports_at_torchrecs_path(path: str) -> None:
    module = importlib.import_module(path)
    assert not [name for name in NAMES[path] if not hasattr(module, name)]


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100, feature_names=["f0"]),
        EmbeddingBagConfig(name="t1", embedding_dim=16, num_embeddings=60, feature_names=["f1"]),
    ])  # fmt: skip


# ------------------------------------------------------------------ lightrec.types, lightrec.streamable
def test_types_mixins_and_streamable_protocols() -> None:
    from lightrec.modules.embedding_configs import DataType as Home
    from lightrec.streamable import Multistreamable, Pipelineable
    from lightrec.types import DataType, ModuleCopyMixin, ModuleNoCopyMixin

    class Moved(nn.Linear, ModuleCopyMixin):
        pass

    class Kept(nn.Linear, ModuleNoCopyMixin):
        pass

    moved, kept = Moved(2, 2), Kept(2, 2)
    assert DataType is Home and moved.copy(torch.device("meta")).weight.is_meta and kept.copy(torch.device("meta")) is kept
    kjt = KeyedJaggedTensor.from_lengths_sync(["f0"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    assert isinstance(kjt, Pipelineable) and isinstance(torch.zeros(1), Multistreamable)
    assert not isinstance(object(), Multistreamable)


# ------------------------------------------------------------------ comm topology
def test_topology_helpers_follow_the_launcher_else_eight_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _TOPOLOGY_VARS:
        monkeypatch.delenv(name, raising=False)
    assert get_local_size(16) == 8 and get_local_size(12) == 12  # 8 does not divide 12: one host
    assert get_local_rank(16, rank=13) == 5 and get_group_rank(16, rank=13) == 1 and get_num_groups(16) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert get_local_size(8) == 4 and get_group_rank(8, rank=5) == 1 and get_num_groups(8) == 2
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert get_local_rank(8, rank=5) == 3  # the launcher's word wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='four'"):
        get_local_size(8)
    with pytest.raises(RuntimeError, match="no process group"):
        get_num_groups()


def _topology_body(rank: int, world_size: int) -> tuple[int, int, int, int, float]:
    import os

    from lightrec.distributed.comm import intra_and_cross_node_pg

    os.environ["LOCAL_WORLD_SIZE"] = "1"  # two hosts of one rank each
    os.environ.pop("LOCAL_RANK", None)
    intra, cross = intra_and_cross_node_pg()
    assert intra is not None and cross is not None
    again = intra_and_cross_node_pg()
    assert again == (intra, cross)  # created once
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, group=cross)
    return dist.get_world_size(intra), dist.get_world_size(cross), get_local_size(), get_group_rank(), float(total)


def test_intra_and_cross_node_groups_on_two_gloo_ranks() -> None:
    assert run_ranks(_topology_body, 2) == [(1, 2, 1, 0, 3.0), (1, 2, 1, 1, 3.0)]


# ------------------------------------------------------------------ distributed.types
def test_pipeline_and_bounds_check_enums_and_sharded_tensor() -> None:
    from lightrec.distributed.sharding.state_dict import ShardedTableState
    from lightrec.distributed.types import BoundsCheckMode, PipelineType, ShardedTensor

    assert PipelineType("train_sparse_dist") is PipelineType.TRAIN_SPARSE_DIST
    assert BoundsCheckMode.FATAL.bounds_check == "error" and BoundsCheckMode.WARNING.bounds_check == "clamp"
    assert int(BoundsCheckMode.NONE) == 3 and ShardedTensor is ShardedTableState


def test_a_sharded_module_of_ones_own_runs_its_three_stages() -> None:
    from lightrec.distributed.sharding.collection import ShardedCollectionBase
    from lightrec.distributed.types import Awaitable, LazyAwaitable, LazyNoWait, NoWait, ShardedModule

    class Doubling(ShardedModule[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]):
        def create_context(self) -> list[str]:
            return []

        def input_dist(self, ctx: list[str], *input: torch.Tensor, **kw: object) -> Awaitable[Awaitable[torch.Tensor]]:
            ctx.append("input_dist")
            return NoWait(NoWait(input[0]))

        def compute(self, ctx: list[str], dist_input: torch.Tensor) -> torch.Tensor:
            ctx.append("compute")
            return 2 * dist_input

        def output_dist(self, ctx: list[str], output: torch.Tensor) -> LazyAwaitable[torch.Tensor]:
            assert ctx == ["input_dist", "compute"]
            return LazyNoWait(output + 1)

    out = Doubling()(torch.tensor([1.0, 2.0]))
    assert torch.equal(out.wait(), torch.tensor([3.0, 5.0])) and issubclass(ShardedCollectionBase, ShardedModule)


# ------------------------------------------------------------------ shard layouts, sharding_plan
def test_shard_layouts_and_placement() -> None:
    from lightrec.distributed import sharding_plan as sp

    assert sp.placement("cuda", 5, 4) == "rank:5/cuda:1" and sp.placement("cpu", 3, 2) == "rank:3/cpu"
    assert sp._calculate_rw_shard_sizes_and_offsets(10, 4, 8) == (
        [[3, 8], [3, 8], [3, 8], [1, 8]], [[0, 0], [3, 0], [6, 0], [9, 0]])
    assert sp._calculate_cw_shard_sizes_and_offsets(256, 10) == ([[10, 128], [10, 128]], [[0, 0], [0, 128]])
    assert sp._calculate_grid_shard_sizes_and_offsets(10, 2, 256) == (
        [[5, 128]] * 4, [[0, 0], [5, 0], [0, 128], [5, 128]])
    assert sp._calculate_uneven_rw_shard_sizes_and_offsets(10, 2, 4, [1, 3]) == ([[2, 4], [8, 4]], [[0, 0], [2, 0]])
    table = torch.empty(10, 8)
    assert sp.calculate_shard_sizes_and_offsets(table, 4, 2, "table_row_wise") == ([[5, 8]] * 2, [[0, 0], [5, 0]])
    assert sp.calculate_shard_sizes_and_offsets(table, 4, 2, "table_wise") == ([[10, 8]], [[0, 0]])
    with pytest.raises(ValueError, match="sharding_type"):
        sp.calculate_shard_sizes_and_offsets(table, 4, 2, "diagonal")  # fmt: skip


def test_apply_to_all_and_default_sharders_by_type() -> None:
    from lightrec.distributed.sharding_plan import (
        apply_to_all,
        construct_module_sharding_plan,
        get_module_to_default_sharders,
        row_wise,
    )

    ebc = _ebc()
    assert isinstance(get_module_to_default_sharders()[EmbeddingBagCollection], EmbeddingBagCollectionSharder)
    plan = construct_module_sharding_plan(ebc, apply_to_all(ebc, row_wise()), world_size=2)
    assert {name: p.sharding_type for name, p in plan.items()} == {"t0": "row_wise", "t1": "row_wise"}
    with pytest.raises(ValueError, match="no default sharder shards Linear"):
        apply_to_all(nn.Linear(2, 2), row_wise())


# ------------------------------------------------------------------ planner constants, enumerators, utils
def test_constants_kernel_bandwidths_and_partition_kinds() -> None:
    from lightrec.distributed.planner import constants as c
    from lightrec.distributed.planner.enumerators import (
        GUARDED_COMPUTE_KERNELS,
        get_partition_by_type,
        sharder_name,
    )

    assert (c.BIGINT_DTYPE, c.POOLING_FACTOR, c.UVM_CACHING_RATIO, c.KV_CACHING_RATIO) == (8, 1.0, 0.2, 0.2)
    hbm, ddr, h2d = 1000.0, 100.0, 10.0
    assert c.kernel_bw_lookup("cpu", "dense", hbm, ddr, h2d) == 50.0
    assert c.kernel_bw_lookup("cuda", "fused_uvm_caching", hbm, ddr, h2d, 0.5) == (0.5 * hbm + 0.5 * h2d) / 10
    assert c.kernel_bw_lookup("cuda", "fused_uvm_caching", hbm, ddr, h2d, 0.5, prefetch_pipeline=True) == hbm
    assert c.kernel_bw_lookup("cpu", "key_value", hbm, ddr, h2d) is None
    assert "customized_kernel" in GUARDED_COMPUTE_KERNELS
    assert [get_partition_by_type(t) for t in ("table_wise", "row_wise", "table_row_wise")] == [
        "device", "uniform", "host"]
    assert sharder_name(EmbeddingBagCollection) == "lightrec.modules.embedding_modules.EmbeddingBagCollection"


def test_planner_utils_small_helpers() -> None:
    from lightrec.distributed.planner.types import Storage
    from lightrec.distributed.planner.utils import (
        BinarySearchPredicate,
        bytes_to_gb,
        prod,
        storage_repr_in_gb,
    )

    assert bytes_to_gb(3 * 1024**3) == 3.0 and prod([2, 3, 4]) == 24 and prod([]) == 1
    assert storage_repr_in_gb(Storage(hbm=1024**3, ddr=0)) == "Storage(hbm = 1.0 GB, ddr = 0.0 GB)"
    search, best, probe, seen = BinarySearchPredicate(0, 100, 1), None, None, 0
    probe = search.next(True)
    while probe is not None and seen < 20:  # the largest x in [0, 100] with x <= 37
        seen += 1
        ok = probe <= 37
        best = probe if ok else best
        probe = search.next(ok)
    assert best == 37 and seen <= 8


# ------------------------------------------------------------------ storage formulas
def test_calculate_shard_storages_equals_the_hand_computed_bytes() -> None:
    from lightrec.distributed.planner.shard_estimators import (
        calculate_pipeline_io_cost,
        calculate_shard_storages,
    )
    from lightrec.distributed.types import PipelineType

    # table-wise 100 x 8 fp32, batch 4, 2 ids per bag, 2 ranks: ids 2*4*2 ranks * 8 B = 128,
    # pooled outputs 4*2 ranks * 8 cols * 4 B = 256, weights 3200, no optimizer state
    args = dict(sharding_type="table_wise", tensor=torch.empty(100, 8), compute_kernel="fused", shard_sizes=[[100, 8]],
                batch_sizes=[4], world_size=2, local_world_size=2, input_lengths=[2.0], num_poolings=[1.0],
                caching_ratio=0.2, is_pooled=True, input_data_type_size=8, output_data_type_size=4)  # fmt: skip
    sharder = EmbeddingBagCollectionSharder()
    (cpu,) = calculate_shard_storages(sharder, compute_device="cpu", **args)  # type: ignore[arg-type]
    (gpu,) = calculate_shard_storages(sharder, compute_device="cuda", **args)  # type: ignore[arg-type]
    assert (cpu.hbm, cpu.ddr) == (0, 128 + 256 + 3200) and (gpu.hbm, gpu.ddr) == (128 + 256 + 3200, 0)
    assert calculate_pipeline_io_cost(100, 50, 30, PipelineType.NONE, None) == 150
    assert calculate_pipeline_io_cost(100, 50, 30, PipelineType.TRAIN_SPARSE_DIST, None) == 200
    assert calculate_pipeline_io_cost(100, 50, 30, PipelineType.TRAIN_SPARSE_DIST, None, True) == 250
    assert calculate_pipeline_io_cost(100, 50, 30, PipelineType.TRAIN_PREFETCH_SPARSE_DIST, 2) == 300 + 120
    assert calculate_pipeline_io_cost(100, 50, 30, PipelineType.TRAIN_BASE, None, is_inference=True) == 0


# ------------------------------------------------------------------ an extension sharder, SharderData
class WeightBag(nn.Module):
    """An extension's module: one raw table, no lightrec config."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(50, 16))


class WeightBagSharder(ModuleSharder[WeightBag]):
    """torchrec's extension form: parameters as the shardable tables, a kernel of its own."""

    @property
    def module_type(self) -> type[nn.Module]:
        return WeightBag

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:  # type: ignore[override]
        return {"weight": module.weight}  # type: ignore[dict-item]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [*super().compute_kernels(sharding_type, compute_device_type), "customized_kernel"]


def test_an_extension_sharder_plans_with_sharder_data() -> None:
    from lightrec.distributed.planner.types import SharderData
    from lightrec.distributed.planner.utils import build_sharder_data_map, sharder_name
    from lightrec.distributed.types import StorageUsageType

    sharder = WeightBagSharder(fused_params={"optimizer": "sgd"})
    data = build_sharder_data_map({sharder_name(WeightBag): sharder})
    assert data == {sharder_name(WeightBag): SharderData({"optimizer": "sgd"}, {}, StorageUsageType.DEFAULT)}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    ps = planner.plan(WeightBag(), [sharder]).plan[""]["weight"]
    assert ps.compute_kernel != "customized_kernel"  # guarded: planned only where a constraint names it
    named = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                     constraints={"weight": ParameterConstraints(compute_kernels=["customized_kernel"])})
    with pytest.raises((ValueError, PlannerError), match="cannot cost"):
        named.plan(WeightBag(), [sharder])


def test_sharder_data_records_quantized_collectives() -> None:
    from lightrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from lightrec.distributed.planner.utils import build_sharder_data

    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16))
    data = build_sharder_data(EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry))
    assert data.qcomm_dtype_sizes["POOLED_EMBEDDINGS_ALL_TO_ALL"] == (2.0, 2.0)
    assert data.storage_usage_type.value == "BaseEmbeddingSharder"
    with pytest.raises(TypeError, match="ModuleSharder"):
        build_sharder_data(object())  # type: ignore[arg-type]


def test_grid_shard_is_named_and_refused_by_the_planner() -> None:
    from lightrec.distributed.types import ShardingType

    assert ShardingType("grid_shard") is ShardingType.GRID_SHARD
    assert "grid_shard" not in EmbeddingBagCollectionSharder().sharding_types("cpu")
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                       constraints={"t0": ParameterConstraints(sharding_types=["grid_shard"])})
    with pytest.raises((ValueError, PlannerError), match="does not build this sharding"):
        planner.plan(_ebc(), [EmbeddingBagCollectionSharder()])


# ------------------------------------------------------------------ options to plans and back
def _options() -> list[ShardingOption]:
    topo = Topology(world_size=2, compute_device="cpu")
    return EmbeddingEnumerator(topo).enumerate(_ebc(), [EmbeddingBagCollectionSharder()])


def test_to_sharding_plan_and_extract_plan_round_trip() -> None:
    from lightrec.distributed.planner.planners import extract_plan, to_sharding_plan

    space = _options()
    assert len({o.storage_hash() for o in space}) == len(space)
    assert [o.storage_hash() for o in space] == [o.storage_hash() for o in _options()]  # stable across runs
    chosen = [next(o for o in space if o.name == t and o.sharding_type == "table_wise") for t in ("t0", "t1")]
    for rank, option in enumerate(chosen):
        option.shards[0].rank = rank
    plan = to_sharding_plan(chosen, Topology(world_size=2, compute_device="cpu"))
    assert plan.plan[""]["t1"].ranks == [1]
    assert plan.plan[""]["t1"].sharding_spec[0].placement == "rank:1/cpu"  # type: ignore[index]
    fresh = extract_plan(_options(), {o.storage_hash(): o for o in chosen})
    assert [(o.name, o.shards[0].rank) for o in fresh] == [("t0", 0), ("t1", 1)]
    with pytest.raises(PlannerError, match="changed"):
        extract_plan([o for o in _options() if o.name == "t0"], {o.storage_hash(): o for o in chosen})
    chosen[0].shards[0].rank = None
    with pytest.raises(ValueError, match="no rank"):
        to_sharding_plan(chosen, Topology(world_size=2, compute_device="cpu"))


def test_shard_perf_contexts_and_hardware_config() -> None:
    from lightrec.distributed.planner.estimator.types import HardwarePerfConfig, ShardPerfContext

    class Slow(HardwarePerfConfig):
        kernel_device_bandwidths = {("cpu", "fused"): 123.0}
        _supported_sharding_types = frozenset({"table_wise"})

    option = next(o for o in _options() if (o.name, o.sharding_type, o.compute_kernel) == ("t1", "table_wise", "fused"))
    topo = Topology(world_size=2, compute_device="cpu")
    (ctx,) = ShardPerfContext.build_shard_perf_contexts(Slow(), [[60, 16]], option, topo, None,
                                                        EmbeddingBagCollectionSharder())  # fmt: skip
    assert (ctx.hash_size, ctx.emb_dim, ctx.world_size, ctx.table_data_type_size) == (60, 16, 2, 4.0)
    assert ctx.batch_inputs == sum(option.input_lengths) * option.batch_size and ctx.device_bw == 123.0
    assert HardwarePerfConfig().get_device_bw("cuda", "fused", 10.0, 1.0, 0.1, 1.0) == 10.0
    with pytest.raises(ValueError, match="not supported by Slow"):
        Slow().validate_sharding_type("row_wise")
    with pytest.raises(ValueError, match="no bandwidth is known"):
        HardwarePerfConfig().get_device_bw("cpu", "key_value", 10.0, 1.0, 0.1, 1.0)


def test_collective_plan_defaults_the_sharders() -> None:
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    assert set(planner.collective_plan(_ebc()).plan[""]) == {"t0", "t1"}
