"""torchrec's storage formulas: the bytes every shard of an option needs in device and host
memory, as ``torchrec.distributed.planner.shard_estimators.calculate_shard_storages`` counts them.

lightrec's planner sizes shards with its own model (``shard_estimators.estimate_shards``); these
functions are torchrec's, for extensions that compute a shard's memory the torchrec way (e.g. a
custom storage estimator that adds its own state on top). Per shard::

    input bytes   ids the shard receives per step   (x input_data_type_size)
    output bytes  rows it returns                   (x output_data_type_size)
    tensor bytes  its weights: sharder.storage_usage(tensor, ...) x rows*cols share of the table
    optimizer     tensor bytes x the optimizer multiplier (SGD 0, Adam 2, row-wise Adagrad 1/D, other 1)
    cache state   tiered kernels: rows x (4 + 16 x cache load factor)

    device memory (cuda) = tensor + optimizer + cache state + calculate_pipeline_io_cost(input, output)
    host memory (cpu)    = input + output + tensor + optimizer

The ids and outputs per step follow the sharding type (``_calculate_shard_io_sizes``): table- and
column-wise shards serve the world's batch, row-wise ones their share of its ids, data-parallel
ones the local batch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    ModuleSharder,
    PipelineType,
    ShardingType,
)
from lightrec.distributed.planner.types import Storage
from lightrec.distributed.planner.utils import get_num_poolings, prod
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad

__all__ = ["calculate_pipeline_io_cost", "calculate_shard_storages", "get_num_poolings"]

_CACHED_KERNELS = (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.KEY_VALUE.value)


def calculate_pipeline_io_cost(
    input_size: int,
    output_size: int,
    prefetch_size: int,
    pipeline_type: PipelineType,
    multipass_prefetch_max_pass: int | None,
    count_ephemeral_storage_cost: bool = False,
    is_inference: bool = False,
) -> int:
    """Device bytes a shard's inputs and outputs hold at the peak of a training step.

    Inference holds none. A sparse-dist pipeline keeps two batches' ids (the next batch's input
    dist runs during this one); a prefetching one three, plus ``1 + 6 / passes`` times the prefetched
    ids. The output counts only with ``count_ephemeral_storage_cost`` (it lives from the forward's
    all-to-all to the backward). Every other loop: the ids and the output once.
    """
    if is_inference:
        return 0
    output = output_size if count_ephemeral_storage_cost else 0
    if pipeline_type == PipelineType.TRAIN_SPARSE_DIST:
        return 2 * input_size + output
    if pipeline_type == PipelineType.TRAIN_PREFETCH_SPARSE_DIST:
        passes = multipass_prefetch_max_pass or 1
        return 3 * input_size + int((1 + 6 / passes) * prefetch_size) + output
    return input_size + output_size


def _calculate_shard_io_sizes(
    sharding_type: str,
    batch_sizes: list[int],
    world_size: int,
    local_world_size: int,
    input_lengths: list[float],
    emb_dim: int,
    shard_sizes: list[list[int]],
    input_data_type_size: float,
    output_data_type_size: float,
    num_poolings: list[float],
    is_pooled: bool,
) -> tuple[list[int], list[int]]:
    """``(input bytes, output bytes)`` of every shard per step (see the module docstring)."""
    inputs = sum(x * y * z for x, y, z in zip(input_lengths, num_poolings, batch_sizes))
    outputs_per_sample = sum(y * z for y, z in zip(num_poolings, batch_sizes))
    kind = sharding_type
    if kind == ShardingType.DATA_PARALLEL.value:
        outputs = outputs_per_sample if is_pooled else inputs
        return ([math.ceil(inputs * input_data_type_size)] * len(shard_sizes),
                [math.ceil(outputs * emb_dim * output_data_type_size)] * len(shard_sizes))  # fmt: skip
    if kind in (ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value):
        outputs = outputs_per_sample if is_pooled else inputs
        widths = [emb_dim] if kind == ShardingType.TABLE_WISE.value else [size[1] for size in shard_sizes]
        return ([math.ceil(inputs * world_size * input_data_type_size)] * len(widths),
                [math.ceil(outputs * world_size * w * output_data_type_size) for w in widths])  # fmt: skip
    if kind in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value):
        share = inputs / (world_size if kind == ShardingType.ROW_WISE.value else local_world_size)
        outputs = outputs_per_sample if is_pooled else share
        return ([math.ceil(share * world_size * input_data_type_size) if prod(size) else 0 for size in shard_sizes],
                [math.ceil(outputs * world_size * size[1] * output_data_type_size) if prod(size) else 0
                 for size in shard_sizes])  # fmt: skip
    raise ValueError(f"unknown sharding_type {sharding_type!r}; use a ShardingType value")


def _get_optimizer_multipler(optimizer_class: type[torch.optim.Optimizer] | None, shape: torch.Size) -> float:
    """Optimizer state per weight byte: SGD 0, Adam 2, row-wise Adagrad ``1 / D``, any other 1."""
    if optimizer_class is None:
        return 0.0
    if issubclass(optimizer_class, torch.optim.SGD):
        return 0.0
    if issubclass(optimizer_class, torch.optim.Adam):
        return 2.0
    if issubclass(optimizer_class, RowWiseAdagrad):
        return 1.0 / shape[-1]
    return 1.0


def _calculate_storage_specific_sizes(
    storage: int,
    shape: torch.Size,
    shard_sizes: list[list[int]],
    sharding_type: str,
    optimizer_class: type[torch.optim.Optimizer] | None = None,
    is_inference: bool = False,
    clf: float | None = None,
) -> list[int]:
    """Weights, optimizer state and (``clf``: a cached table) cache state of every shard."""
    whole = sharding_type == ShardingType.DATA_PARALLEL.value
    tensors = [storage if whole else math.ceil(storage * prod(size) / prod(shape)) for size in shard_sizes]
    multiplier = _get_optimizer_multipler(optimizer_class, shape)
    caches = [0 if clf is None else math.ceil(size[0] * (4 + clf * 16)) for size in shard_sizes]
    if is_inference:
        return tensors
    return [t + math.ceil(t * multiplier) + c for t, c in zip(tensors, caches)]


def calculate_shard_storages(
    sharder: ModuleSharder[nn.Module],
    sharding_type: str,
    tensor: torch.Tensor,
    compute_device: str,
    compute_kernel: str,
    shard_sizes: list[list[int]],
    batch_sizes: list[int],
    world_size: int,
    local_world_size: int,
    input_lengths: list[float],
    num_poolings: list[float],
    caching_ratio: float,
    is_pooled: bool,
    input_data_type_size: float,
    output_data_type_size: float,
    pipeline_type: PipelineType = PipelineType.NONE,
    count_ephemeral_storage_cost: bool = False,
    is_inference: bool = False,
    multipass_prefetch_max_pass: int | None = None,
) -> list[Storage]:
    """Device (``hbm``) and host (``ddr``) bytes of every shard (see the module docstring).

    Args:
        sharder: reads the table's bytes (``storage_usage``).
        tensor: the table (its shape, dtype and ``_optimizer_classes``, set by
            ``apply_optimizer_in_backward``); ``shard_sizes``: ``[rows, cols]`` of each shard.
        batch_sizes, input_lengths, num_poolings: per feature: batch size, ids per bag, poolings
            per sample.
        caching_ratio: cache load factor of a tiered kernel (its cache is that share of the table).
        input_data_type_size, output_data_type_size: bytes of an id and of an output element.
        pipeline_type, count_ephemeral_storage_cost, multipass_prefetch_max_pass: the training
            loop (:func:`calculate_pipeline_io_cost`); ``is_inference``: no gradients, no state.
    """
    inputs, outputs = _calculate_shard_io_sizes(
        sharding_type, batch_sizes, world_size, local_world_size, input_lengths, int(tensor.shape[1]), shard_sizes,
        input_data_type_size, output_data_type_size, num_poolings, is_pooled,
    )  # fmt: skip
    usage = sharder.storage_usage(tensor, compute_device, compute_kernel)
    hbm, ddr = usage.get("hbm", 0), usage.get("ddr", 0)
    cached = compute_kernel in _CACHED_KERNELS
    if cached:
        hbm = round(ddr * caching_ratio)
    if compute_kernel == EmbeddingComputeKernel.KEY_VALUE.value:
        ddr = 0  # the rows live on SSD
    optimizer_class = getattr(tensor, "_optimizer_classes", [None])[0]
    hbm_specific = _calculate_storage_specific_sizes(hbm, tensor.shape, shard_sizes, sharding_type, optimizer_class,
                                                     is_inference, caching_ratio if cached else None)  # fmt: skip
    ddr_specific = _calculate_storage_specific_sizes(ddr, tensor.shape, shard_sizes, sharding_type, optimizer_class,
                                                     is_inference)  # fmt: skip
    hbm_sizes = [
        specific + calculate_pipeline_io_cost(i, o, i if cached else 0, pipeline_type, multipass_prefetch_max_pass,
                                              count_ephemeral_storage_cost, is_inference)  # fmt: skip
        if compute_device == "cuda" else 0
        for i, o, specific in zip(inputs, outputs, hbm_specific)
    ]
    ddr_sizes = [
        i + o + specific if compute_device in ("cpu", "mtia") and not is_inference else specific
        for i, o, specific in zip(inputs, outputs, ddr_specific)
    ]
    return [Storage(hbm=h, ddr=d) for h, d in zip(hbm_sizes, ddr_sizes)]
