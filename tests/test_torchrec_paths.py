"""``sed s/torchrec/lightrec/`` on a torchrec user's imports: every mirrored path and name imports,
and the torchrec signatures issue 17 lists are accepted with torchrec's meaning.

The table below is written from torchrec's public layout (its docs and API pages), not generated
from torchrec; docs/migrating-from-torchrec.md lists the same paths.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import torch
from torch import nn

TORCHREC_PATHS: dict[str, list[str]] = {
    "torchrec": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "EmbeddingBagCollection",
                 "EmbeddingCollection", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "DataType"],
    "torchrec.sparse.jagged_tensor": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "jt_is_equal",
                                      "kjt_is_equal", "ComputeKJTToJTDict", "ComputeJTDictToKJT"],
    "torchrec.modules.embedding_configs": ["EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "DataType",
                                           "QuantConfig", "data_type_to_dtype", "pooling_type_to_str",
                                           "BaseEmbeddingConfig"],
    "torchrec.modules.embedding_modules": ["EmbeddingBagCollection", "EmbeddingCollection"],
    "torchrec.modules.mlp": ["MLP", "Perceptron"],
    "torchrec.modules.activation": ["SwishLayerNorm"],
    "torchrec.modules.crossnet": ["CrossNet", "LowRankCrossNet", "LowRankMixtureCrossNet", "VectorCrossNet"],
    "torchrec.modules.deepfm": ["DeepFM", "FactorizationMachine"],
    "torchrec.modules.fused_embedding_modules": ["FusedEmbeddingBagCollection", "FusedEmbeddingCollection",
                                                 "fuse_embedding_optimizer"],
    "torchrec.optim.keyed": ["KeyedOptimizer", "CombinedOptimizer", "KeyedOptimizerWrapper", "OptimizerWrapper"],
    "torchrec.optim.optimizers": ["in_backward_optimizer_filter"],
    "torchrec.optim.apply_optimizer_in_backward": ["apply_optimizer_in_backward"],
    "torchrec.optim.rowwise_adagrad": ["RowWiseAdagrad"],
    "torchrec.quant.embedding_modules": ["EmbeddingBagCollection", "EmbeddingCollection",
                                         "QuantEmbeddingBagCollection", "QuantEmbeddingCollection"],
    "torchrec.fx": ["Tracer", "symbolic_trace"],
    "torchrec.fx.tracer": ["Tracer", "symbolic_trace"],
    "torchrec.models.dlrm": ["DLRM", "DLRM_DCN", "DLRM_Projection", "DLRMTrain", "DLRMWrapper", "DenseArch",
                             "InteractionArch", "InteractionDCNArch", "InteractionProjectionArch", "OverArch",
                             "SparseArch"],
    "torchrec.models.deepfm": ["DenseArch", "FMInteractionArch", "OverArch", "SimpleDeepFMNN",
                               "SimpleDeepFMNNWrapper", "SparseArch"],
    "torchrec.distributed": ["DistributedModelParallel", "ModuleSharder", "ShardingEnv", "ShardingPlan",
                             "ShardingType", "ParameterSharding", "EmbeddingBagCollectionSharder",
                             "EmbeddingCollectionSharder"],
    "torchrec.distributed.types": ["Awaitable", "LazyAwaitable", "NoWait", "LazyNoWait", "LazyGetItemMixin",
                                   "ModuleSharder", "ShardingType", "ShardingEnv", "ShardingPlan",
                                   "ParameterSharding", "EnumerableShardingSpec", "ShardMetadata",
                                   "EmbeddingModuleShardingPlan"],
    "torchrec.distributed.sharding_plan": ["construct_module_sharding_plan", "table_wise", "row_wise",
                                           "column_wise", "data_parallel", "table_row_wise", "table_column_wise",
                                           "get_default_sharders"],
    "torchrec.distributed.embedding_types": ["EmbeddingComputeKernel", "ShardingType", "BaseEmbeddingSharder"],
    "torchrec.distributed.embeddingbag": ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"],
    "torchrec.distributed.embedding": ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"],
    "torchrec.distributed.model_parallel": ["DistributedModelParallel"],
    "torchrec.distributed.model_tracker": ["DeltaTrackerConfig", "TrackingMode", "UpdateMode", "ModelDeltaTrackerTrec",
                                           "ModelDeltaTracker", "UniqueRows", "DeltaStoreTrec", "Trackers"],
    "torchrec.distributed.model_tracker.types": ["DeltaTrackerConfig", "TrackingMode", "UpdateMode", "UniqueRows",
                                                 "IndexedLookup", "ModelTrackerConfig", "EmbdUpdateMode", "DeltaRows"],
    "torchrec.distributed.dist_data": ["KJTAllToAll", "PooledEmbeddingsAllToAll", "PooledEmbeddingsReduceScatter",
                                       "PooledEmbeddingsAllGather", "SequenceEmbeddingsAllToAll"],
    "torchrec.distributed.planner": ["EmbeddingShardingPlanner", "Topology", "ParameterConstraints"],
    "torchrec.distributed.planner.types": ["Topology", "ParameterConstraints", "PlannerError"],
    "torchrec.distributed.planner.planners": ["EmbeddingShardingPlanner"],
    "torchrec.distributed.shard": ["_shard_modules"],
    # issue 26: the second pass (training loop, data, planner parts, modules, serving, metrics)
    "torchrec.datasets.utils": ["Batch", "safe_cast", "LoadFiles", "ReadLinesFromCSV"],
    "torchrec.datasets.random": ["RandomRecDataset"],
    "torchrec.datasets.criteo": ["DEFAULT_CAT_NAMES", "DEFAULT_INT_NAMES", "DEFAULT_LABEL_NAME", "DEFAULT_COLUMN_NAMES",
                                 "CAT_FEATURE_COUNT", "INT_FEATURE_COUNT", "DAYS", "criteo_kaggle", "criteo_terabyte",
                                 "CriteoIterDataPipe", "BinaryCriteoUtils", "InMemoryBinaryCriteoIterDataPipe"],
    "torchrec.datasets.movielens": ["DEFAULT_RATINGS_COLUMN_NAMES", "DEFAULT_MOVIES_COLUMN_NAMES", "movielens_20m",
                                    "movielens_25m"],
    "torchrec.distributed.train_pipeline": ["TrainPipelineSparseDist", "EvalPipelineSparseDist", "TrainPipelineBase",
                                            "TrainPipeline", "TrainPipelineContext", "In", "Out", "Tracer", "ArgInfo",
                                            "_rewrite_model", "_start_data_dist", "_to_device", "_wait_for_batch",
                                            "_override_input_dist_forwards"],
    "torchrec.distributed.train_pipeline.train_pipelines": ["TrainPipelineSparseDist", "EvalPipelineSparseDist",
                                                            "TrainPipelineBase"],
    # issue 37: what custom pipelines compose (torchrec's pipeline_context / utils / tracing)
    "torchrec.distributed.train_pipeline.pipeline_context": ["TrainPipelineContext", "In", "Out",
                                                             "PrefetchTrainPipelineContext",
                                                             "EmbeddingTrainPipelineContext"],
    "torchrec.distributed.train_pipeline.utils": ["TrainPipelineContext", "In", "Out", "Tracer", "ArgInfo", "ArgInfoStep",
                                                  "ArgInfoStepFactory", "CallArgs", "BaseForward", "PipelinedForward",
                                                  "_rewrite_model", "_start_data_dist", "_wait_for_batch",
                                                  "_wait_for_events", "_to_device", "_override_input_dist_forwards",
                                                  "_pipeline_detach_model", "_get_leaf_module_names",
                                                  "_fuse_input_dist_splits", "_build_args_kwargs", "get_h2d_func",
                                                  "ShardedModule"],
    "torchrec.distributed.train_pipeline.runtime_forwards": ["BaseForward", "PipelinedForward"],
    "torchrec.distributed.train_pipeline.tracing": ["Tracer", "ArgInfo", "ArgInfoStep", "ArgInfoStepFactory",
                                                    "CallArgs"],
    "torchrec.distributed.fbgemm_qcomm_codec": ["QCommsConfig", "CommType", "get_qcomm_codecs_registry",
                                                "get_qcomm_codecs", "CommOp"],
    "torchrec.distributed.planner.enumerators": ["EmbeddingEnumerator"],
    "torchrec.distributed.planner.shard_estimators": ["EmbeddingPerfEstimator", "EmbeddingStorageEstimator"],
    "torchrec.distributed.planner.storage_reservations": ["HeuristicalStorageReservation",
                                                          "FixedPercentageStorageReservation"],
    "torchrec.distributed.planner.proposers": ["GreedyProposer", "GridSearchProposer", "UniformProposer"],
    "torchrec.distributed.planner.partitioners": ["GreedyPerfPartitioner", "SortBy"],
    "torchrec.distributed.planner.perf_models": ["NoopPerfModel"],
    "torchrec.distributed.quant_embeddingbag": ["QuantEmbeddingBagCollectionSharder", "ShardedQuantEmbeddingBagCollection"],
    "torchrec.distributed.fused_embeddingbag": ["FusedEmbeddingBagCollectionSharder", "ShardedFusedEmbeddingBagCollection"],
    "torchrec.distributed.fp_embeddingbag": ["FeatureProcessedEmbeddingBagCollectionSharder",
                                             "ShardedFeatureProcessedEmbeddingBagCollection"],
    "torchrec.inference.modules": ["quantize_embeddings", "PredictFactory", "PredictModule", "BatchingMetadata",
                                   "quantize_dense"],
    "torchrec.inference.model_packager": ["PredictFactoryPackager", "load_config_text", "load_pickle_config"],
    "torchrec.inference.state_dict_transform": ["state_dict_gather", "state_dict_to_device", "state_dict_all_gather_keys"],
    "torchrec.metrics.metric_module": ["RecMetricModule", "generate_metric_module", "StateMetric"],
    "torchrec.metrics.metrics_config": ["RecMetricEnum", "RecTaskInfo", "RecMetricDef", "MetricsConfig", "ThroughputDef",
                                        "StateMetricEnum", "DefaultMetricsConfig", "DefaultTaskInfo"],
    "torchrec.metrics.metrics_namespace": ["MetricName", "MetricNamespace", "MetricPrefix", "compose_metric_key"],
    "torchrec.metrics.rec_metric": ["RecMetric", "RecMetricList", "RecMetricException"],
    "torchrec.metrics.throughput": ["ThroughputMetric"],
    "torchrec.modules.feature_processor_": ["FeatureProcessor", "PositionWeightedModule", "FeatureProcessorsCollection",
                                            "PositionWeightedModuleCollection"],
    "torchrec.modules.fp_embedding_modules": ["FeatureProcessedEmbeddingBagCollection", "apply_feature_processors_to_kjt"],
    "torchrec.optim.clipping": ["GradientClipping", "GradientClippingOptimizer"],
    "torchrec.optim.warmup": ["WarmupOptimizer", "WarmupPolicy", "WarmupStage"],
}  # fmt: skip
TORCHREC_PATHS["torchrec.distributed"] += ["TrainPipelineSparseDist"]
TORCHREC_PATHS["torchrec.distributed.types"] += ["QuantizedCommCodecs"]
TORCHREC_PATHS["torchrec.distributed.planner"] += ["EmbeddingEnumerator", "HeuristicalStorageReservation",
                                                   "GreedyPerfPartitioner", "GreedyProposer"]  # fmt: skip
TORCHREC_PATHS["torchrec.distributed.planner.types"] += ["ShardingPlan", "ShardingOption", "Shard", "Storage", "Perf",
                                                         "Enumerator", "Proposer", "Partitioner", "StorageReservation",
                                                         "PerfModel", "ShardEstimator"]  # fmt: skip
TORCHREC_PATHS["torchrec.optim.optimizers"] += ["LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB"]
# issue 37: the third pass, data side (sparse helpers, collection interfaces, metric computations)
TORCHREC_PATHS.update({
    "torchrec.sparse.tensor_dict": ["maybe_td_to_kjt"],
    "torchrec.sparse.jagged_tensor_validator": ["validate_keyed_jagged_tensor"],
    "torchrec.metrics.accuracy": ["AccuracyMetricComputation", "AccuracyMetric"],
    "torchrec.metrics.auc": ["AUCMetric"],
    "torchrec.metrics.calibration": ["CalibrationMetric"],
    "torchrec.metrics.ctr": ["CTRMetric"],
    "torchrec.metrics.gauc": ["GAUCMetricComputation", "GAUCMetric"],
    "torchrec.metrics.mae": ["MAEMetricComputation", "MAEMetric"],
    "torchrec.metrics.mse": ["MSEMetricComputation", "MSEMetric"],
    "torchrec.metrics.ne": ["NEMetricComputation", "NEMetric"],
    "torchrec.test_utils": ["get_free_port", "skip_if_asan", "skip_if_asan_class", "seed_and_log"],
})  # fmt: skip
TORCHREC_PATHS["torchrec.sparse.jagged_tensor"] += ["_regroup_keyed_tensors", "_fbgemm_permute_pooled_embs",
                                                    "_kt_regroup_arguments", "_all_keys_used_once"]  # fmt: skip
TORCHREC_PATHS["torchrec.metrics.rec_metric"] += ["RecMetricComputation", "MetricComputationReport"]
TORCHREC_PATHS["torchrec.modules.embedding_modules"] += ["EmbeddingBagCollectionInterface",
                                                         "EmbeddingCollectionInterface", "get_embedding_names_by_table"]
TORCHREC_PATHS["torchrec.modules.embedding_configs"] += ["DATA_TYPE_NUM_BITS"]
TORCHREC_PATHS["torchrec.quant.embedding_modules"] += ["quant_prep_enable_cache_features_order"]
TORCHREC_PATHS["torchrec.datasets.criteo"] += ["TOTAL_TRAINING_SAMPLES"]
TORCHREC_PATHS["torchrec.optim"] = ["SGD", "Adam", "Adagrad"]
TORCHREC_PATHS["torchrec.distributed.embedding_lookup"] = ["GroupedPooledEmbeddingsLookup", "GroupedEmbeddingsLookup"]
TORCHREC_PATHS["torchrec.distributed.embedding_types"] += ["ShardedEmbeddingTable", "GroupedEmbeddingConfig", "KJTList"]
TORCHREC_PATHS["torchrec.distributed.model_parallel"] += ["DataParallelWrapper", "DefaultDataParallelWrapper",
                                                          "get_module", "get_unwrapped_module"]  # fmt: skip
TORCHREC_PATHS["torchrec.distributed.quant_embedding_kernel"] = ["_unwrap_kjt", "_unwrap_kjt_for_cpu"]
TORCHREC_PATHS["torchrec.distributed.embeddingbag"] += ["_create_mean_pooling_divisor"]
# issue 37: torchrec.ir, the torch.export round trip (tests/ir/)
TORCHREC_PATHS.update({
    "torchrec.ir.serializer": ["JsonSerializer", "EBCJsonSerializer", "PWMJsonSerializer", "PWMCJsonSerializer",
                               "FPEBCJsonSerializer", "embedding_bag_config_to_metadata", "embedding_metadata_to_config",
                               "get_deserialized_device"],
    "torchrec.ir.utils": ["encapsulate_ir_modules", "decapsulate_ir_modules", "unlift_and_swap_modules",
                          "mark_dynamic_kjt", "qualname", "get_device", "DYNAMIC_DIMS"],
    "torchrec.ir.types": ["SerializerInterface"],
    "torchrec.ir.schema": ["EmbeddingBagConfigMetadata", "EBCMetadata", "FPEBCMetadata", "PositionWeightedModuleMetadata",
                           "PositionWeightedModuleCollectionMetadata"],
})  # fmt: skip



@pytest.mark.parametrize("path", sorted(TORCHREC_PATHS))
def test_torchrec_path_imports_under_lightrec(path: str) -> None:
    module = importlib.import_module(path.replace("torchrec", "lightrec"))
    missing = [name for name in TORCHREC_PATHS[path] if not hasattr(module, name)]
    assert not missing, f"{path} -> lightrec lacks {missing}"


def test_mirrors_are_the_same_objects() -> None:
    from lightrec.distributed.comm import LazyAwaitable
    from lightrec.distributed.types import LazyAwaitable as FromTypes
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection as FromModules
    from lightrec.sparse import KeyedJaggedTensor
    from lightrec.sparse.jagged_tensor import KeyedJaggedTensor as FromPath

    assert FromTypes is LazyAwaitable and FromModules is FusedEmbeddingBagCollection and FromPath is KeyedJaggedTensor


# ----------------------------------------------------------------------------------- signatures
def test_module_sharder_is_generic() -> None:
    from lightrec.distributed.types import ModuleSharder

    alias = ModuleSharder[nn.Module]
    assert alias.__origin__ is ModuleSharder  # type: ignore[attr-defined]


def test_column_wise_size_per_rank_and_device_types_and_table_wise_device() -> None:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise

    ebc = EmbeddingBagCollection([
        EmbeddingBagConfig(name="a", num_embeddings=5, embedding_dim=8, feature_names=["x"]),
        EmbeddingBagConfig(name="b", num_embeddings=5, embedding_dim=8, feature_names=["y"]),
    ], device="meta")  # fmt: skip
    plan = construct_module_sharding_plan(
        ebc, {"a": column_wise(size_per_rank=[6, 2], device_types=["cpu", "cuda"]), "b": table_wise(1, device="cpu")},
        world_size=2, device_type="cuda",
    )  # fmt: skip
    a, b = plan["a"], plan["b"]
    assert [s.shard_sizes for s in a.sharding_spec] == [[5, 6], [5, 2]] and a.ranks == [0, 1]
    assert [s.device for s in a.sharding_spec] == ["cpu", "cuda:1"]
    assert b.sharding_spec.shards[0].placement == "rank:1/cpu"  # EnumerableShardingSpec's .shards
    with pytest.raises(ValueError, match="exactly one of ranks"):
        column_wise()
    with pytest.raises(ValueError, match="add up to the table's 8 columns"):
        construct_module_sharding_plan(ebc, {"a": column_wise(size_per_rank=[3, 3])}, world_size=2)


def test_keyed_optimizer_init_state_save_param_groups_and_wrappers() -> None:
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper

    emb = nn.Embedding(4, 2, sparse=True)
    lin = nn.Linear(2, 1)
    sparse_opt = KeyedOptimizerWrapper({"emb.weight": emb.weight}, lambda ps: torch.optim.Adagrad(ps, lr=0.1))
    dense_opt = KeyedOptimizerWrapper(dict(lin.named_parameters()), lambda ps: torch.optim.Adam(ps, lr=0.1))
    combined = CombinedOptimizer([("s", sparse_opt), ("d", dense_opt)])
    combined.init_state({"s.emb.weight"})  # Adagrad's state from a sparse zero gradient
    assert set(combined.state_dict()["state"]) == {"s.emb.weight", "d.weight", "d.bias"}
    assert emb.weight.grad is None and torch.count_nonzero(combined.state_dict()["state"]["d.weight"]["exp_avg"]) == 0
    with pytest.raises(KeyError, match="unknown parameters"):
        dense_opt.init_state(["nope"])
    combined.save_param_groups(False)
    state = combined.state_dict()
    assert state["param_groups"] == []
    combined.load_state_dict(state)  # loads the state, keeps the groups
    wrapped = OptimizerWrapper(combined)
    assert wrapped.state_dict().keys() == state.keys() and wrapped() is wrapped  # torchrec's call form
    lin(emb(torch.tensor([1]))).sum().backward()
    wrapped.step()
    assert combined.state_dict()["state"]["d.weight"]["step"] == 1


def test_fused_optimizer_property_is_also_callable_and_fuse_embedding_optimizer() -> None:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from lightrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection, fuse_embedding_optimizer

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=6, embedding_dim=2,
                                                                  feature_names=["f"])])  # fmt: skip

        def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
            return self.ebc(kjt).values()

    model = Model()
    before = model.ebc.embedding_bags["t"].weight.detach().clone()
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    expected = model(kjt).detach()
    fuse_embedding_optimizer(model, torch.optim.SGD, {"lr": 0.5}, torch.device("cpu"))
    assert isinstance(model.ebc, FusedEmbeddingBagCollection)
    torch.testing.assert_close(model(kjt), expected)
    model(kjt).sum().backward()  # SGD inside backward: rows 1 and 2 move by -0.5
    after = model.ebc.state_dict()["embedding_bags.t.weight"]
    torch.testing.assert_close(after[[1, 2]], before[[1, 2]] - 0.5)
    torch.testing.assert_close(after[[0, 3]], before[[0, 3]])
    from lightrec.optim import CombinedOptimizer

    assert isinstance(model.ebc.fused_optimizer(), CombinedOptimizer)  # torchrec calls it; lightrec's is a property
    with pytest.raises(ValueError, match="holds no EmbeddingBagCollection"):
        fuse_embedding_optimizer(nn.Linear(1, 1), torch.optim.SGD, {"lr": 0.1}, "cpu")


def test_quant_config_per_table_weight_dtype() -> None:
    from torch.ao import quantization as quant

    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.modules.embedding_configs import DataType, QuantConfig
    from lightrec.quant import QuantEmbeddingBagCollection

    ebc = EmbeddingBagCollection([
        EmbeddingBagConfig(name="a", num_embeddings=5, embedding_dim=8, feature_names=["x"]),
        EmbeddingBagConfig(name="b", num_embeddings=5, embedding_dim=8, feature_names=["y"]),
    ])  # fmt: skip
    ebc.qconfig = QuantConfig(
        activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
        weight=quant.PlaceholderObserver.with_args(dtype=torch.qint8),
        per_table_weight_dtype={"b": torch.float16},
    )
    q = QuantEmbeddingBagCollection.from_float(ebc)
    assert [c.data_type for c in q.embedding_bag_configs()] == [DataType.INT8, DataType.FP16]


def test_lazy_get_item_mixin_waits_only_when_used() -> None:
    from lightrec.distributed.types import LazyAwaitable, LazyGetItemMixin

    calls = []

    class Result(LazyGetItemMixin[str, torch.Tensor], LazyAwaitable[dict[str, torch.Tensor]]):
        def _wait_impl(self) -> dict[str, torch.Tensor]:
            calls.append(1)
            return {"f": torch.ones(2)}

    item = Result()["f"]
    assert calls == [] and isinstance(item, LazyAwaitable)
    torch.testing.assert_close(item + 1, torch.full((2,), 2.0))
    assert calls == [1]


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> object:
        from lightrec.distributed.comm import LazyNoWait

        return LazyNoWait(x * 2)


class _ReturnsLazy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> object:
        return self.inner(x)


def test_lazy_awaitable_survives_fx_tracing() -> None:
    from lightrec.fx import symbolic_trace

    traced = symbolic_trace(_ReturnsLazy())
    torch.testing.assert_close(traced(torch.ones(3)), torch.full((3,), 2.0))  # a tensor, not an awaitable


def test_dlrm_projection_and_wrapper() -> None:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from lightrec.models.dlrm import DLRM_Projection, DLRMWrapper

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name="t", num_embeddings=6, embedding_dim=2, feature_names=["f", "g"])]
    model = DLRM_Projection(EmbeddingBagCollection(tables), 3, [4, 2], [5, 1], [4, 6], [4, 4])
    dense = torch.randn(2, 3)
    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1]))
    d = model.dense_arch(dense)
    s = model.sparse_arch(kjt)  # [B, F, D]
    x = torch.cat([d.unsqueeze(1), s], dim=1).flatten(1)
    p1 = model.inter_arch.interaction_branch1(x).view(2, 3, 2)
    p2 = model.inter_arch.interaction_branch2(x).view(2, 2, 2)
    want = model.over_arch(torch.cat([d, torch.bmm(p1, p2).flatten(1)], dim=1))
    torch.testing.assert_close(model(dense, kjt), want)
    with pytest.raises(ValueError, match="multiple of the embedding dim 2"):
        DLRM_Projection(EmbeddingBagCollection(tables), 3, [4, 2], [5, 1], [4, 5], [4, 4])

    class ModelInput:
        def __init__(self) -> None:
            self.float_features, self.idlist_features, self.label = dense, kjt, torch.tensor([1.0, 0.0])

    wrapper = DLRMWrapper(EmbeddingBagCollection(tables), 3, [4, 2], [5, 1])
    loss, logits = wrapper(ModelInput())
    torch.testing.assert_close(loss, nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), ModelInput().label))
    assert wrapper.eval()(ModelInput()).shape == (2, 1)


# --------------------------------------------------------------- homes and re-exports (issue 32)
# docs/torchrec-paths.md lists every module at a torchrec path with its role: ``home`` (lightrec's
# code for that idea lives there) or ``re-export`` (imports, ``__all__`` and aliases only) and the
# modules it re-exports from. The tests below keep the table equal to the code, so a re-export
# module that grows a body, or a new torchrec-path module, has to be placed in the table on purpose.
PATHS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "torchrec-paths.md"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lightrec"


def _source(module: str) -> Path:
    path = PACKAGE_DIR.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _is_re_export_statement(node: ast.stmt) -> bool:
    """An import, the docstring, ``__all__`` (built from other modules' ``__all__`` too) or an alias."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return True
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
        return isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute))
    return False


def re_export_homes(module: str) -> list[str] | None:
    """The lightrec modules ``module`` re-exports from, or None when it holds code of its own (a home)."""
    tree = ast.parse(_source(module).read_text())
    if not all(_is_re_export_statement(node) for node in tree.body):
        return None
    package = module if _source(module).name == "__init__.py" else module.rpartition(".")[0]
    homes: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:  # `from pkg import submodule` re-exports from the submodule
                sub = f"{base}.{alias.name}"
                homes.add(sub if _source(sub).exists() else base)
        elif isinstance(node, ast.Import):
            homes.update(a.name for a in node.names)
    return sorted(h for h in homes if h.split(".")[0] == "lightrec")


def _claimed_torchrec_paths() -> set[str]:
    """lightrec modules whose docstring's first paragraph names their own torchrec path."""
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        first = (ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0]
        torchrec = "torchrec" + module[len("lightrec") :]
        if re.search(rf"``{re.escape(torchrec)}(``|\.)", first):
            found.add(torchrec)
    return found


def documented_paths() -> dict[str, tuple[str, str, list[str]]]:
    """``{torchrec path: (lightrec module, role, homes)}`` from the page's table."""
    rows = {}
    for line in PATHS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`torchrec"):
            homes = re.findall(r"`([\w.]+)`", cells[3])
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2], homes)
    return rows


def expected_paths() -> list[str]:
    """The torchrec paths the table must cover: those tested here, the managed-collision ones, and
    those a lightrec docstring claims."""
    from tests.modules.managed_collision.test_mc_torchrec_paths import MC_PATHS

    return sorted(set(TORCHREC_PATHS) | set(MC_PATHS) | _claimed_torchrec_paths())


def table_row(path: str) -> str:
    """The table row of ``path`` as the code stands (``python -m tests.test_torchrec_paths`` prints all)."""
    module = "lightrec" + path[len("torchrec") :]
    homes = re_export_homes(module)
    role, homes = ("home", [module]) if homes is None else ("re-export", homes)
    return f"| `{path}` | `{module}` | {role} | " + ", ".join(f"`{h}`" for h in homes) + " |"


def test_every_torchrec_path_is_in_the_table() -> None:
    documented = documented_paths()
    missing = [table_row(p) for p in expected_paths() if p not in documented]
    assert not missing, f"add these rows to {PATHS_PAGE.name}:\n" + "\n".join(missing)
    for torchrec, (lightrec, _, _) in documented.items():
        assert lightrec == "lightrec" + torchrec[len("torchrec") :], f"{torchrec}: the table names {lightrec}"


@pytest.mark.parametrize("path", sorted(documented_paths()))
def test_torchrec_path_is_a_home_or_a_pure_re_export(path: str) -> None:
    module, role, homes = documented_paths()[path]
    assert role in ("home", "re-export"), f"{path}: role {role!r} (home or re-export)"
    actual = re_export_homes(module)
    if role == "re-export":
        assert actual is not None, f"{module} defines code: move it to its home, or mark the row `home`"
        assert homes == actual, f"{module} re-exports from {actual}; the table says {homes}: {table_row(path)}"
    else:
        assert actual is None, f"{module} only re-exports (from {actual}): mark the row `re-export`"
        assert homes == [module], f"{path}: a home row names its own module, got {homes}"
    assert importlib.import_module(module)


if __name__ == "__main__":  # print the table of docs/torchrec-paths.md as the code stands
    print("| torchrec path | lightrec module | role | lightrec home |\n| --- | --- | --- | --- |")
    print("\n".join(table_row(p) for p in expected_paths()))
