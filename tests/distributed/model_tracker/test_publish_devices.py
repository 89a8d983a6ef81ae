"""The tracker and both publishers on a DMP whose tables live on the CPU (gloo) or on a CUDA device
(NCCL; ``gpu``-marked, one device): the tracker's ids are the rows the batches touched, and a
snapshot plus the deltas written by ``publish_changes`` and ``BackgroundPublisher`` rebuild the
trained tables bit for bit at each version's step. The same test body runs on both, so the CPU run
checks the logic the CUDA run relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.multiprocess import run_ranks

ROWS = {"t0": 200, "t1": 50}


def _body(rank: int, world_size: int, tmp: str, device_type: str, keep_kjts: bool = False) -> dict[str, Any]:
    if keep_kjts:  # what the tracker records on an accelerator (the KJT, its offsets read at the flush)
        from lightrec.distributed.model_tracker import model_delta_tracker

        model_delta_tracker._recorded_ids = lambda features: features
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from lightrec.distributed import DistributedModelParallel, get_default_sharders
    from lightrec.distributed.deltas import BackgroundPublisher, publish_changes
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from lightrec.models import DLRM

    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=8, feature_names=[f"f_{n}"])
              for n, r in ROWS.items()]  # fmt: skip
    model = DLRM(EmbeddingBagCollection(tables, device="meta"), dense_in_features=4, dense_arch_layer_sizes=[8],
                 over_arch_layer_sizes=[8, 1])  # fmt: skip
    fused = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}
    dmp = DistributedModelParallel(model, device=device, sharders=get_default_sharders(fused))
    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    folder = f"{tmp}/publish"
    publisher = BackgroundPublisher(dmp)
    generator = torch.Generator().manual_seed(11)

    def weights() -> dict[str, torch.Tensor]:
        state = dmp.gather_full_state_dict(dst=0)
        return {n: state[k].float().cpu().clone() for n in ROWS for k in state if k.endswith(f"embedding_bags.{n}.weight")}

    expected: dict[Any, dict[str, torch.Tensor]] = {1: weights()}
    assert publish_changes(dmp, folder, tracker, consumer="publish") == 1
    touched: list[set[int]] = []
    for step in range(1, 6):  # step 5 trains while version 3 (step 4) is written in the background
        ids = {n: torch.randint(0, r, (6,), generator=generator) for n, r in ROWS.items()}
        sparse = KeyedJaggedTensor([f"f_{n}" for n in ROWS], torch.cat(list(ids.values())),
                                   lengths=torch.tensor([2, 1, 3] * len(ROWS))).to(device)  # fmt: skip
        dmp(torch.randn(3, 4, device=device), sparse).sum().backward()
        for p in dmp.parameters():
            p.grad = None
        touched.append(set(ids["t0"].tolist()))
        if step == 2:
            tracked = tracker.get_unique_ids("publish")  # read: the next delta starts here
            t0 = next(v for k, v in tracked.items() if k.endswith("t0"))
            assert set(t0.cpu().tolist()) == touched[0] | touched[1], (t0, touched)
            assert publish_changes(dmp, folder, tracker, consumer="publish", snapshot=True, global_step=2) == 2
            expected[2] = weights()
        elif step == 4:
            expected[publisher.publish(folder, tracker, consumer="publish", global_step=4)] = weights()
    publisher.close()
    expected = {k if isinstance(k, int) else k.result(): v for k, v in expected.items()}
    return {"expected": expected}


def _check(tmp_path: Path, results: list[dict[str, Any]]) -> None:
    from lightrec.distributed.deltas import DeltaReader

    reader = DeltaReader(tmp_path / "publish")
    assert reader.versions() == [1, 2, 3]
    assert [reader.manifest(v).kind for v in (1, 2, 3)] == ["snapshot", "snapshot", "delta"]
    for version, tables in results[0]["expected"].items():
        state = reader.state(version)
        for name, weight in tables.items():
            assert torch.equal(state.rows[name].values, weight), (version, name)


@pytest.mark.parametrize("keep_kjts", [False, True], ids=["ids-and-offsets", "kjts-as-on-accelerators"])
def test_the_tracker_and_both_publishers_on_cpu_tables(tmp_path: Path, keep_kjts: bool) -> None:
    _check(tmp_path, run_ranks(_body, 1, args=(str(tmp_path), "cpu", keep_kjts), timeout=240))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_tracker_and_both_publishers_on_cuda_tables(tmp_path: Path) -> None:
    _check(tmp_path, run_ranks(_body, 1, args=(str(tmp_path), "cuda"), timeout=300, backend="nccl"))
