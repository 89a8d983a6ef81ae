"""Host syncs on the single-device fused training path and in the sparse data path, counted on CPU.

On CUDA each ``Tensor.item`` / ``bool`` / ``int`` / ``float`` / ``tolist`` / ``nonzero`` stalls the
host until the stream has caught up, and so do ``torch.tensor(host data, device=...)`` (a blocking
copy from pageable memory) and ``torch.repeat_interleave`` without ``output_size`` (it reads the
output size). On CPU they cost nothing, but the same calls are made, so counting them (those made
by lightrec's own code) finds the syncs a GPU run would have. The CUDA twin runs the same step
under ``torch.cuda.set_sync_debug_mode("error")`` (``-m gpu``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from lightrec._native import native_ops
from lightrec.data import SyntheticCriteoDataset
from lightrec.distributed.comm.kjt_all_to_all import KJTAllToAll
from lightrec.distributed.sharding.common import KeySelector
from lightrec.kernels import FusedEmbeddingBagCollection, input_checks
from lightrec.models import DLRM
from lightrec.sparse import KeyedJaggedTensor
from tests.multiprocess import run_ranks
from tests.triton_support import DEVICE, requires_triton

_READS = ("item", "__bool__", "__int__", "__float__", "tolist", "nonzero")


@contextmanager
def count_host_reads() -> Iterator[Counter]:
    """Count reads of tensor values made directly by lightrec code, as ``{"file:line name": n}``."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(name: str):  # noqa: ANN202
        original = originals[name]

        def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            caller = sys._getframe(1).f_code
            if "/lightrec/" in caller.co_filename.replace("\\", "/"):
                counts[f"{caller.co_filename.rsplit('lightrec/', 1)[-1]}:{caller.co_name} {name}"] += 1
            return original(self, *args, **kwargs)

        return counted

    def from_lightrec() -> str | None:
        caller = sys._getframe(2).f_code
        if "/lightrec/" not in caller.co_filename.replace("\\", "/"):
            return None
        return f"{caller.co_filename.rsplit('lightrec/', 1)[-1]}:{caller.co_name}"

    real_tensor, real_repeat = torch.tensor, torch.repeat_interleave

    def tensor(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        where = from_lightrec()
        if where is not None and kwargs.get("device") is not None:  # host data copied to a device
            counts[f"{where} tensor(device=)"] += 1
        return real_tensor(*args, **kwargs)

    def repeat_interleave(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        where = from_lightrec()
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        if where is not None and isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
            counts[f"{where} repeat_interleave"] += 1
        return real_repeat(*args, **kwargs)

    for name in _READS:
        setattr(torch.Tensor, name, wrap(name))
    torch.tensor, torch.repeat_interleave = tensor, repeat_interleave
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.tensor, torch.repeat_interleave = real_tensor, real_repeat


def _model_and_data(
    backend: str, id_check: str, device: torch.device
) -> tuple[torch.nn.Module, SyntheticCriteoDataset]:
    data = SyntheticCriteoDataset(
        batch_size=32, num_batches=4, num_embeddings_cap=500, device=device, ids_per_feature=2
    )
    ebc = FusedEmbeddingBagCollection(
        data.table_configs(8),
        fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.05},
        kernel_backend=backend,
        device=device,
        id_check=id_check,
    )
    return DLRM(ebc, 13, [16, 8], [16, 1]).to(device), data


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch) -> None:  # noqa: ANN001
    logits = model(batch.dense_features, batch.sparse_features).reshape(-1)
    torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    optimizer.step()
    optimizer.zero_grad()


def _reads_in_one_step(backend: str, id_check: str) -> Counter:
    model, data = _model_and_data(backend, id_check, DEVICE if backend == "triton" else torch.device("cpu"))
    dense = [p for n, p in model.named_parameters() if "embedding" not in n]
    optimizer = torch.optim.SGD(dense, lr=0.01)
    _train_step(model, optimizer, data[0])  # warm-up (kernels compile, state is created)
    with count_host_reads() as counts:
        _train_step(model, optimizer, data[1])
    return counts


def test_torch_backend_reads_the_device_once_per_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The combined id/offset/one-id-per-bag check: one ``tolist`` per step, nothing else.

    The torch-op form of the check is the one an accelerator runs; on CPU it is forced here by
    turning the native check pass off. The collection's negative-length / NaN-weight check reads
    the lengths too, but only for a KJT on the host (``check_collection_input`` skips it on an
    accelerator, where the ``check_values`` read finds both): it is counted here, on CPU, and is
    not a sync a GPU run would have."""
    monkeypatch.setattr(input_checks, "_native_checks", lambda: False)
    counts = _reads_in_one_step("torch", "sync")
    assert counts == Counter(
        {"kernels/input_checks.py:check_values tolist": 1, "sparse/kjt_checks.py:check_lengths_and_weights __int__": 1}
    )


@pytest.mark.skipif(native_ops() is None, reason="lightrec's native CPU ops are not built here")
def test_native_check_pass_reads_no_tensor_on_cpu() -> None:
    """On CPU the native pass returns its verdicts as ints: no tensor is read at all."""
    counts = _reads_in_one_step("torch", "sync")
    assert counts == Counter({"sparse/kjt_checks.py:check_lengths_and_weights __int__": 1})


@requires_triton
def test_triton_backend_with_device_side_id_checks_never_reads_the_device() -> None:
    """On an accelerator nothing is read. Under Triton's interpreter the batch is on the host, where
    the collection's negative-length check reads the lengths (one read, as for the torch backend)."""
    on_host = Counter({"sparse/kjt_checks.py:check_lengths_and_weights __int__": 1})
    assert _reads_in_one_step("triton", "async") == (on_host if DEVICE.type == "cpu" else Counter())


@pytest.mark.gpu
def test_cuda_fused_training_step_runs_under_sync_debug_error() -> None:
    """Opt-in (-m gpu): Triton backend, batches drawn on the GPU, no host sync in the step."""
    device = torch.device("cuda")
    model, data = _model_and_data("triton", "auto", device)
    optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if "embedding" not in n], lr=0.01)
    _train_step(model, optimizer, data[0])  # compiles the kernels, creates optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # drawing the batch on the GPU is part of the step
        _train_step(model, optimizer, data[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _kjt(weighted: bool) -> KeyedJaggedTensor:
    """Three keys, batch 2, with host-side ``length_per_key`` (as lightrec's datasets attach)."""
    lengths = torch.tensor([1, 2, 0, 3, 2, 1])
    values = torch.arange(9)
    weights = torch.rand(9) if weighted else None
    return KeyedJaggedTensor(
        ["a", "b", "c"], values, weights, lengths=lengths, stride=2, length_per_key=[3, 3, 3]
    )


def test_kjt_permute_with_host_sizes_reads_nothing() -> None:
    """The output size comes from ``length_per_key``: no read of the device's lengths."""
    kjt = _kjt(weighted=True)
    index = torch.tensor([2, 0], dtype=torch.int32)
    with count_host_reads() as counts:
        out = kjt.permute([2, 0], index)
    assert counts == Counter()
    assert out.keys() == ["c", "a"] and out.length_per_key() == [3, 3]
    assert out.values().tolist() == [6, 7, 8, 0, 1, 2]


def test_kjt_permute_hands_the_output_size_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """fbgemm's ``permute_2D_sparse_data`` reads the output size from the device (in C++, unseen
    by the counter above) unless it is given ``permuted_lengths_sum``."""
    from lightrec.sparse import kjt_transforms  # the tensor work of KeyedJaggedTensor.permute

    seen: list[int | None] = []
    real = kjt_transforms.permute_2d_sparse

    def spy(*args: Any) -> Any:
        seen.append(args[4] if len(args) > 4 else None)
        return real(*args)

    monkeypatch.setattr(kjt_transforms, "permute_2d_sparse", spy)
    _kjt(weighted=False).permute([1, 1, 2])
    assert seen == [9]


def test_key_selector_dropping_weights_keeps_host_sizes() -> None:
    """An unweighted sharding of a weighted KJT: selecting and reordering its keys reads nothing,
    and the selected KJT still knows its sizes on the host."""
    select = KeySelector([1, 0], keep_weights=False)
    select(_kjt(weighted=True), None)  # the first call builds its index tensor (once)
    with count_host_reads() as counts:
        out = select(_kjt(weighted=True), None)
        sizes = out.length_per_key()
    assert counts == Counter()
    assert out.weights_or_none() is None and sizes == [3, 3]


def _all_to_all_counts(rank: int, world_size: int) -> dict[str, int]:
    kjt = _kjt(weighted=False)
    all_to_all = KJTAllToAll(None, [2, 1])
    all_to_all(kjt).wait().wait()  # the first call builds the per-device split tensors (once)
    with count_host_reads() as counts:
        splits = all_to_all(kjt)
    splits.wait().wait()  # (the exchanged counts sizing the receive buffers are the known sync)
    return dict(counts)


def test_kjt_all_to_all_builds_no_tensor_from_host_data_per_call() -> None:
    """Starting an input dist copies nothing from the host (the key splits are cached per device)."""
    assert run_ranks(_all_to_all_counts, world_size=2) == [{}, {}]
