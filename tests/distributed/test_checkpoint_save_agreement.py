"""A sharded save whose part fails on one rank fails on every rank, before any file is written.

``save_sharded_checkpoint`` collects each rank's part (its tables, its optimizer state) and then
writes collectively. A rank that cannot collect its part -- here rank 1 passes an optimizer that
steps a parameter of another module -- used to raise alone while the others waited for it in the
write's first collective; now every rank raises the same ``CheckpointError`` naming rank 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.multiprocess import run_ranks


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def _save_with_a_foreign_optimizer_on_rank_1(rank: int, world_size: int, path: str) -> str:
    from lightrec.distributed.checkpoint import CheckpointError, save_sharded_checkpoint

    model = _model()
    stepped = model if rank == 0 else _model()  # rank 1: the optimizer of another copy of the model
    opt = torch.optim.Adam(stepped.parameters(), lr=0.01)
    stepped(torch.ones(2, 3)).sum().backward()
    opt.step()
    try:
        save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]},
                                model, [opt])  # fmt: skip
    except CheckpointError as e:
        return str(e)
    return "saved"


def test_a_part_failing_on_one_rank_fails_every_rank_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    results = run_ranks(_save_with_a_foreign_optimizer_on_rank_1, 2, args=(str(path),), timeout=120)
    for message in results:  # rank 0 had nothing wrong, and must neither wait nor write
        assert message.startswith("rank 1: ValueError: optimizers[0] (Adam) steps a parameter of shape [4, 3]")
        assert "rank 0" not in message
    assert not path.exists()
    assert os.listdir(tmp_path) == []  # no temporary folder left either


def test_one_process_keeps_its_plain_error(tmp_path: Path) -> None:
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    model, other = _model(), _model()
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"optimizers\[0\] \(SGD\) steps a parameter of shape \[4, 3\]"):
        save_sharded_checkpoint(tmp_path / "ckpt", {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]},
                                model, [opt])  # fmt: skip
    assert not (tmp_path / "ckpt").exists()
