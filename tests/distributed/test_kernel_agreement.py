"""The ranks of a sharded collection end their fused CPU kernel trials on ONE kernel (``KernelAgreement``).

Each rank's trial clock is faked (``cpu_shared_lookup._clock``) so that the ranks, deciding alone, would
split; the step costs are per kernel and per rank, no timing is asserted."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels.cpu_update import native_update_available
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not fbgemm_available() or not native_update_available(torch.device("cpu"), torch.float32),
    reason="needs fbgemm's CPU TBE and the native update (the two kernels a trial chooses between)",
)


def _body(rank: int, world_size: int, ms_by_rank: list[dict[str, float]], tables_on: list[int]) -> dict[str, Any]:
    import os

    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.kernels import cpu_shared_lookup
    from lightrec.kernels.cpu_shared_lookup import TRIAL_STEPS, SharedCpuLookup
    from lightrec.kernels.kernel_interface import LookupBatch
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from lightrec.sparse import KeyedJaggedTensor

    os.environ["LIGHTREC_CPU_KERNEL"] = "auto"  # the suite pins fbgemm
    ms = ms_by_rank[rank]
    ticks: list[float] = [0.0]

    def fake_clock() -> float:  # step i takes the cost of the kernel the schedule gives it, on this rank
        step = len(ticks) - 1
        ticks.append(ticks[-1] + ms[cpu_shared_lookup._TRIAL_SCHEDULE[min(step, TRIAL_STEPS - 1)]] / 1000)
        return ticks[-2]

    cpu_shared_lookup._clock = fake_clock
    configs = [EmbeddingBagConfig(num_embeddings=64, embedding_dim=16, name=f"t{i}", feature_names=[f"f{i}"])
               for i in range(2)]  # fmt: skip
    ebc = EmbeddingBagCollection(configs)
    plan = construct_module_sharding_plan(
        ebc, {f"t{i}": table_wise(rank=r) for i, r in enumerate(tables_on)}, world_size=world_size
    )
    sharder = EmbeddingBagCollectionSharder({"optimizer": "row_wise_adagrad", "learning_rate": 0.05})
    sharded = sharder.shard(ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD))
    kernels = [m.kernel for m in sharded.modules() if isinstance(getattr(m, "kernel", None), SharedCpuLookup)]
    gen = torch.Generator().manual_seed(rank)
    verdicts_at: dict[int, list[str]] = {}
    for step in range(TRIAL_STEPS + 2):
        kjt = KeyedJaggedTensor(["f0", "f1"], torch.randint(0, 64, (8,), generator=gen), lengths=torch.ones(8, dtype=torch.long))
        sharded(kjt).wait().values().sum().backward()
        verdicts_at[step] = [v.kernel for k in kernels for v in k.verdicts.values()]
    threads = torch.get_num_threads()
    one_id = LookupBatch(torch.zeros(1, dtype=torch.long), torch.tensor([0, 1]), None, 1)
    return {
        "kernels": len(kernels),
        "verdicts": [(k.verdicts[threads].kernel, k.verdicts[threads].detail, k.verdicts[threads].ms) for k in kernels],
        "undecided_before_the_end": all(not verdicts_at[s] for s in range(TRIAL_STEPS - 1)),
        "runs_after": [type(k.kernel_for(one_id)).__name__ for k in kernels],  # the kernel of the next step
    }


def test_ranks_that_would_split_train_with_the_kernel_their_pooled_trials_choose() -> None:
    # Alone, rank 0 would choose torch (8 ms against 10) and rank 1 fbgemm (14 against 10); pooled, torch
    # takes 11 ms a step against fbgemm's 10: fbgemm on both.
    ms_by_rank = [{"torch": 8.0, "fbgemm": 10.0}, {"torch": 14.0, "fbgemm": 10.0}]
    results = run_ranks(_body, 2, args=(ms_by_rank, [0, 1]), timeout=120)
    for rank, result in enumerate(results):
        assert result["kernels"] == 1 and result["undecided_before_the_end"]
        ((kernel, detail, ms),) = result["verdicts"]
        assert kernel == "fbgemm", (rank, detail)
        assert ms == pytest.approx({"torch": 11.0, "fbgemm": 10.0})
        own = "torch, torch 8.0 ms, fbgemm 10.0 ms" if rank == 0 else "fbgemm, torch 14.0 ms, fbgemm 10.0 ms"
        assert f"agreed over 2 groups on 2 ranks (this rank: {own})" in detail
        assert result["runs_after"] == ["SharedCpuLookup"]  # fbgemm's TBE (the shared lookup itself)


def test_a_rank_without_a_trial_takes_part_and_the_others_keep_their_verdict() -> None:
    # Both tables on rank 0: rank 1 holds no kernel, yet joins the collective (no hang), contributing nothing.
    ms_by_rank = [{"torch": 8.0, "fbgemm": 10.0}, {"torch": 14.0, "fbgemm": 10.0}]
    rank0, rank1 = run_ranks(_body, 2, args=(ms_by_rank, [0, 0]), timeout=120)
    assert rank1["kernels"] == 0 and rank1["verdicts"] == []
    assert rank0["kernels"] == 1
    ((kernel, detail, ms),) = rank0["verdicts"]
    assert kernel == "torch" and ms == pytest.approx({"torch": 8.0, "fbgemm": 10.0})
    assert "agreed over 1 groups on 2 ranks" in detail
    assert rank0["runs_after"] == ["TorchBatchedLookup"]
