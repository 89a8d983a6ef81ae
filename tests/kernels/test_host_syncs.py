"""Host reads of device values on the single-device fused training path, counted on CPU.

On CUDA each ``Tensor.item`` / ``bool`` / ``int`` / ``float`` / ``tolist`` / ``nonzero`` stalls the
host until the stream has caught up. On CPU they cost nothing, but the same calls are made, so
counting them (those made by lightrec's own code) finds the syncs a GPU run would have. The CUDA
twin runs the same step under ``torch.cuda.set_sync_debug_mode("error")`` (``-m gpu``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from lightrec.data import SyntheticCriteoDataset
from lightrec.kernels import FusedEmbeddingBagCollection
from lightrec.models import DLRM
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

    for name in _READS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _model_and_data(
    backend: str, id_check: str, device: torch.device
) -> tuple[torch.nn.Module, SyntheticCriteoDataset]:
    data = SyntheticCriteoDataset(
        batch_size=32, num_batches=4, num_embeddings_cap=500, device=device, ids_per_feature=2
    )
    ebc = FusedEmbeddingBagCollection(
        data.table_configs(8),
        fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.05},
        backend=backend,
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


def test_torch_backend_reads_the_device_once_per_lookup() -> None:
    """The combined id/offset/one-id-per-bag check: one ``tolist`` per step, nothing else."""
    counts = _reads_in_one_step("torch", "sync")
    assert counts == Counter({"kernels/input_checks.py:check_values tolist": 1})


@requires_triton
def test_triton_backend_with_device_side_id_checks_never_reads_the_device() -> None:
    assert _reads_in_one_step("triton", "async") == Counter()


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
