"""``kernel_backend="auto"`` on CPU: fbgemm or the native torch kernel, decided and cached per case.

No timing assertions: the measurement is replaced by a fake where the decision is under test, and
only checked for positive times where it really runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import cpu_kernel_choice
from lightrec.kernels.cpu_kernel_choice import (
    UNKNOWN_POOLING_CASES,
    CpuKernelCase,
    CpuKernelVerdict,
    cpu_fused_choice,
    cpu_kernel_verdict,
    forget_verdicts,
    verdict_for_any_pooling,
)
from lightrec.kernels.cpu_update import native_update_available
from lightrec.kernels.kernel_interface import KernelConfig
from lightrec.kernels.kernel_registry import select_backend
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

ROWWISE = CpuKernelCase(threads=1, dim=64, optimizer="row_wise_adagrad")
SGD_POOLED = CpuKernelCase(threads=2, dim=16, optimizer="sgd", ids_per_bag=8)


def _config(optimizer: EmbOptimType, dims: list[int]) -> KernelConfig:
    spec = FusedOptimizerSpec(optimizer, learning_rate=0.01)
    return KernelConfig([10] * len(dims), dims, list(range(len(dims))), PoolingType.SUM, spec, torch.device("cpu"))


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[CpuKernelCase]]:
    """``auto`` with an empty cache in ``tmp_path`` and a fake measurement: torch wins SGD below 32 ids per
    bag (at 32 and more it takes 95 % of fbgemm's time: not clearly faster), fbgemm the rest.
    Yields the cases measured, in order."""
    calls: list[CpuKernelCase] = []

    def fake(case: CpuKernelCase | None = None, iterations: int = 5) -> dict[str, float]:
        assert case is not None
        calls.append(case)
        if case.optimizer != "sgd":
            return {"fbgemm": 1.0, "torch": 4.0}
        return {"fbgemm": 3.0, "torch": 2.0} if case.ids_per_bag < 32 else {"fbgemm": 4.0, "torch": 3.8}

    monkeypatch.setenv("LIGHTREC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "auto")
    monkeypatch.setattr(cpu_kernel_choice, "measure_cpu_kernels", fake)
    monkeypatch.setattr(cpu_kernel_choice, "machine_busy", lambda: False)  # a quiet machine (CI's may not be)
    forget_verdicts()
    yield calls
    forget_verdicts()


def _cache(tmp_path: Path) -> dict[str, dict]:
    return json.loads((tmp_path / "cpu_kernel_choice.json").read_text())


def test_two_cases_are_measured_separately_and_the_file_keeps_both(
    measured: list[CpuKernelCase], tmp_path: Path
) -> None:
    first, second = cpu_kernel_verdict(ROWWISE), cpu_kernel_verdict(SGD_POOLED)
    assert (first.kernel, first.reason, second.kernel, second.reason) == ("fbgemm", "measured", "torch", "measured")
    assert measured == [ROWWISE, SGD_POOLED]
    cached = _cache(tmp_path)
    assert sorted(key.rsplit("|", 4)[1:] == ROWWISE.key().split("|") for key in cached) == [False, True]
    assert {entry["choice"] for entry in cached.values()} == {"fbgemm", "torch"}
    assert cpu_kernel_verdict(ROWWISE) is first  # once per case and process
    forget_verdicts()  # a later process reads the file: nothing measured again
    again = cpu_kernel_verdict(SGD_POOLED)
    assert (again.kernel, again.reason, again.ms) == ("torch", "cached", {"fbgemm": 3.0, "torch": 2.0})
    assert measured == [ROWWISE, SGD_POOLED]
    assert "torch: cached fbgemm 3.0 ms, torch 2.0 ms [threads=2|dim=16|sgd|ids=8]" == again.describe()


def test_the_switch_decides_without_measuring(
    measured: list[CpuKernelCase], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for forced in ("torch", "fbgemm"):
        monkeypatch.setenv("LIGHTREC_CPU_KERNEL", forced)
        forget_verdicts()
        verdict = cpu_kernel_verdict(ROWWISE)
        assert (verdict.kernel, verdict.reason, verdict.ms) == (forced, "forced", None)
        assert f"LIGHTREC_CPU_KERNEL={forced}" in verdict.describe()
    assert measured == [] and not (tmp_path / "cpu_kernel_choice.json").exists()
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "tbe")
    forget_verdicts()
    with pytest.raises(ValueError, match="LIGHTREC_CPU_KERNEL must be one of"):
        cpu_kernel_verdict(ROWWISE)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x": "not an entry"}'])
def test_a_corrupt_cache_file_is_measured_again_and_rewritten(
    measured: list[CpuKernelCase], tmp_path: Path, content: str
) -> None:
    (tmp_path / "cpu_kernel_choice.json").write_text(content)
    assert cpu_kernel_verdict(ROWWISE).reason == "measured" and measured == [ROWWISE]
    entries = [entry for entry in _cache(tmp_path).values() if isinstance(entry, dict)]
    assert [entry["choice"] for entry in entries] == ["fbgemm"]


@pytest.mark.parametrize(
    ("ms", "kernel"),
    [
        ({"fbgemm": 10.0, "torch": 8.5}, "torch"),  # 15 % faster: clearly
        ({"fbgemm": 10.0, "torch": 8.6}, "fbgemm"),  # within the margin: torchrec's kernel, which cannot lose
        ({"fbgemm": 10.0, "torch": 10.0}, "fbgemm"),
        ({"fbgemm": 8.0, "torch": 10.0}, "fbgemm"),
    ],
)
def test_the_torch_kernel_must_win_clearly(ms: dict[str, float], kernel: str) -> None:
    assert cpu_kernel_choice.choose(ms) == kernel


def test_a_measurement_on_a_busy_machine_is_not_cached(
    measured: list[CpuKernelCase], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_kernel_choice, "machine_busy", lambda: True)
    verdict = cpu_kernel_verdict(ROWWISE)
    assert (verdict.kernel, verdict.reason, verdict.detail) == ("fbgemm", "measured", "machine busy: not cached")
    assert "(machine busy: not cached)" in verdict.describe()
    assert not (tmp_path / "cpu_kernel_choice.json").exists()
    assert cpu_kernel_verdict(ROWWISE) is verdict  # this process keeps it
    monkeypatch.setattr(cpu_kernel_choice, "machine_busy", lambda: False)
    forget_verdicts()  # a later process, on a quiet machine: measured again, and cached
    assert cpu_kernel_verdict(ROWWISE).reason == "measured" and measured == [ROWWISE, ROWWISE]
    assert [entry["choice"] for entry in _cache(tmp_path).values()] == ["fbgemm"]


def test_machine_busy_reads_the_load_average(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 1.0, 1.0))
    assert cpu_kernel_choice.machine_busy()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 3.0, 3.0))
    assert not cpu_kernel_choice.machine_busy()


def test_the_case_of_a_group_buckets_its_dim_and_its_ids_per_bag() -> None:
    config = _config(EmbOptimType.ROWWISE_ADAGRAD, [8, 48])
    case = CpuKernelCase.of(config)
    assert case == CpuKernelCase(torch.get_num_threads(), 64, "row_wise_adagrad", 1)
    assert CpuKernelCase.of(config, ids_per_bag=40).ids_per_bag == 64
    assert CpuKernelCase.of(_config(EmbOptimType.SGD, [4]), ids_per_bag=1).dim == 8
    assert CpuKernelCase.of(_config(EmbOptimType.SGD, [])).dim == 8  # a rank without tables of the group
    with pytest.raises(ValueError, match="ids_per_bag must be a positive hint or None, got 0"):
        CpuKernelCase.of(config, ids_per_bag=0)
    dense = KernelConfig([10], [8], [0], PoolingType.SUM, None, torch.device("cpu"))
    with pytest.raises(ValueError, match="config.spec is None"):
        CpuKernelCase.of(dense)


def test_auto_takes_the_verdict_of_the_groups_case_and_says_why(measured: list[CpuKernelCase]) -> None:
    rowwise, sgd = _config(EmbOptimType.ROWWISE_ADAGRAD, [64, 64]), _config(EmbOptimType.SGD, [16])
    adam = _config(EmbOptimType.ADAM, [64])
    verdict = cpu_fused_choice(adam)  # fbgemm has no CPU Adam: nothing to measure
    assert (verdict.kernel, verdict.reason) == ("torch", "fbgemm unsupported") and verdict.detail
    assert select_backend("auto", adam) == "torch"
    if not fbgemm_available():
        assert cpu_fused_choice(rowwise).reason == "fbgemm unsupported" and measured == []
        return
    if not native_update_available(torch.device("cpu"), torch.float32):
        assert cpu_fused_choice(rowwise).reason == "no native update" and select_backend("auto", rowwise) == "fbgemm"
        return
    # Groups whose storage both kernels can serve get both, decided by timing their first training steps:
    # nothing is measured when they are built.
    assert (select_backend("auto", rowwise), select_backend("auto", sgd)) == ("fbgemm|torch", "fbgemm|torch")
    assert cpu_fused_choice(sgd).reason == "timed in training" and measured == []
    # Tables of one dim apart in table order cannot be one torch-kernel tensor over fbgemm's storage:
    # the kernels are built without knowing the ids per bag, so the group is decided at 1 and 32 ids.
    rowwise, sgd = _config(EmbOptimType.ROWWISE_ADAGRAD, [64, 32, 64]), _config(EmbOptimType.SGD, [16, 8, 16])
    assert (select_backend("auto", rowwise), select_backend("auto", sgd)) == ("fbgemm", "fbgemm")
    assert [(c.optimizer, c.ids_per_bag) for c in measured] == [
        ("row_wise_adagrad", 1), ("row_wise_adagrad", 32), ("sgd", 1), ("sgd", 32)
    ]
    assert cpu_fused_choice(rowwise).describe().startswith(
        "fbgemm: unknown ids per bag (fbgemm at 1 and 32 ids per bag); ids=1 -> fbgemm: measured fbgemm 1.0 ms, torch 4.0 ms"
    )
    verdict = cpu_fused_choice(sgd)  # torch wins one-id SGD, not 32-id SGD: torchrec's kernel
    assert [(part.kernel, part.reason) for part in verdict.parts] == [("torch", "measured"), ("fbgemm", "measured")]
    assert "(1 and 32 ids per bag disagree: fbgemm, which cannot lose to torchrec)" in verdict.describe()
    assert "ids=32 -> fbgemm: measured fbgemm 4.0 ms, torch 3.8 ms [threads=" in verdict.describe()
    assert cpu_fused_choice(sgd, ids_per_bag=8).kernel == "torch"  # a caller that knows its pooling: that case
    assert cpu_fused_choice(sgd, ids_per_bag=40).kernel == "fbgemm"
    assert [c.ids_per_bag for c in measured[4:]] == [8, 64]


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu is not importable")
@pytest.mark.parametrize("case", [ROWWISE, SGD_POOLED], ids=lambda c: c.key())
def test_measuring_a_case_times_both_kernels(case: CpuKernelCase) -> None:
    threads = torch.get_num_threads()
    ms = cpu_kernel_choice.measure_cpu_kernels(case, iterations=1)
    assert set(ms) == {"fbgemm", "torch"} and all(v > 0 for v in ms.values())
    assert torch.get_num_threads() == threads  # the case's thread count is set for the measurement only


def test_report_lines_give_one_verdict_per_dim_bucket(measured: list[CpuKernelCase]) -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.01)
    lines = cpu_kernel_choice.cpu_kernel_lines([16, 64, 48, 100], spec)
    assert [line.split(":")[0].strip() for line in lines] == [
        "dim <= 16 (1 tables)",
        "dim <= 64 (2 tables)",
        "dim <= 128 (1 tables)",
    ]
    if fbgemm_available() and native_update_available(torch.device("cpu"), torch.float32):
        # Both kernels over one storage, decided by timing the first training steps: nothing measured now.
        assert all(line.split(": ", 1)[1].startswith("fbgemm|torch: timed in training (both kernels") for line in lines)
        assert measured == []


def _part(kernel: str, ids: int, reason: str = "cached") -> CpuKernelVerdict:
    case = CpuKernelCase(threads=1, dim=64, optimizer="sgd", ids_per_bag=ids)
    return CpuKernelVerdict(kernel, reason, case, {"fbgemm": 1.0, "torch": 1.0})


@pytest.mark.parametrize(
    ("kernels", "chosen"),
    [(("torch", "torch"), "torch"), (("fbgemm", "fbgemm"), "fbgemm"), (("torch", "fbgemm"), "fbgemm"),
     (("fbgemm", "torch"), "fbgemm")],  # fmt: skip
)
def test_unknown_pooling_takes_the_torch_kernel_only_where_it_wins_at_every_pooling(
    kernels: tuple[str, str], chosen: str
) -> None:
    parts = [_part(kernel, ids) for kernel, ids in zip(kernels, UNKNOWN_POOLING_CASES, strict=True)]
    verdict = verdict_for_any_pooling(parts)
    assert (verdict.kernel, verdict.reason, verdict.parts) == (chosen, "unknown ids per bag", tuple(parts))
    agree = "1 and 32 ids per bag disagree" not in verdict.detail
    assert agree == (kernels[0] == kernels[1])


def test_unknown_pooling_keeps_a_forced_verdict_and_needs_parts() -> None:
    forced = CpuKernelVerdict("torch", "forced", ROWWISE, detail="LIGHTREC_CPU_KERNEL=torch")
    assert verdict_for_any_pooling([forced, forced]) == CpuKernelVerdict("torch", "forced", None, None, forced.detail)
    with pytest.raises(ValueError, match="at least one per-pooling verdict"):
        verdict_for_any_pooling([])


def test_unknown_pooling_with_the_switch_measures_nothing(
    measured: list[CpuKernelCase], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "torch")
    verdict = cpu_fused_choice(_config(EmbOptimType.ROWWISE_ADAGRAD, [64]))
    if fbgemm_available() and native_update_available(torch.device("cpu"), torch.float32):
        assert (verdict.kernel, verdict.reason) == ("torch", "forced")
    assert measured == []


def test_a_new_kernels_revision_measures_again(
    measured: list[CpuKernelCase], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict cached before a kernel's Python side changed speed (``_KERNELS_REVISION``) is not reused."""
    assert cpu_kernel_verdict(ROWWISE).reason == "measured"
    forget_verdicts()
    assert cpu_kernel_verdict(ROWWISE).reason == "cached"
    monkeypatch.setattr(cpu_kernel_choice, "_KERNELS_REVISION", cpu_kernel_choice._KERNELS_REVISION + 1)
    forget_verdicts()
    assert cpu_kernel_verdict(ROWWISE).reason == "measured"
    assert measured == [ROWWISE, ROWWISE]


def test_the_switch_is_read_at_every_decision_not_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that builds models under several settings (a benchmark of one kernel against the other, a
    notebook) gets each one: a forced verdict is never remembered for the case."""
    for kernel in ("torch", "fbgemm", "torch"):
        monkeypatch.setenv("LIGHTREC_CPU_KERNEL", kernel)
        verdict = cpu_kernel_verdict(ROWWISE)
        assert (verdict.kernel, verdict.reason) == (kernel, "forced")
        config = KernelConfig([64], [64], [0], PoolingType.SUM, FusedOptimizerSpec(EmbOptimType.EXACT_ROWWISE_ADAGRAD),
                              torch.device("cpu"))  # fmt: skip
        if fbgemm_available():  # else "fbgemm unsupported": the torch kernel whatever the switch says
            assert cpu_fused_choice(config).kernel == kernel
