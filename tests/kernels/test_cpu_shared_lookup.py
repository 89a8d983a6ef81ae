"""``SharedCpuLookup``: fbgemm's CPU TBE and the torch kernel over one storage, the group trained by the
kernel whose first training steps were faster (``StepTrial``). Trained against a plain torch kernel on the
same batches; the trial's clock is faked where its verdict is under test (no timing assertions)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import cpu_shared_lookup
from lightrec.kernels.cpu_kernel_choice import CpuKernelCase, cpu_fused_choice, shared_storage_refusal
from lightrec.kernels.cpu_shared_lookup import SharedCpuLookup, StepTrial
from lightrec.kernels.cpu_update import native_update_available
from lightrec.kernels.kernel_interface import KernelConfig, LookupBatch
from lightrec.kernels.kernel_registry import build_kernel
from lightrec.kernels.torch_backend import TorchBatchedLookup
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

pytestmark = pytest.mark.skipif(
    not fbgemm_available() or not native_update_available(torch.device("cpu"), torch.float32),
    reason="needs fbgemm's CPU TBE and the native update",
)

OPTIMIZERS = [EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD]
TRIAL_STEPS = 86  # 3 warm-up steps per kernel, then 4 rounds of torch, fbgemm, fbgemm, torch blocks of 5 steps


def _config(optimizer: EmbOptimType, dims: list[int], pooling: PoolingType = PoolingType.SUM) -> KernelConfig:
    spec = FusedOptimizerSpec(optimizer, learning_rate=0.05)
    rows = [40 + 13 * t for t in range(len(dims))]
    return KernelConfig(rows, dims, list(range(len(dims))), pooling, spec, torch.device("cpu"))


def _batch(config: KernelConfig, batch: int, ids_per_bag: int, gen: torch.Generator, weighted: bool) -> LookupBatch:
    """``ids_per_bag`` on average: bag lengths drawn from 0 .. 2 * ids_per_bag - 1 (1 exactly for 1)."""
    features = len(config.feature_table_map)
    if ids_per_bag == 1:
        lengths = torch.ones(features * batch, dtype=torch.long)
    else:
        lengths = torch.randint(0, 2 * ids_per_bag, (features * batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    ids = [torch.randint(0, config.rows[config.feature_table_map[f]], (int(n),), generator=gen)
           for f, n in enumerate(lengths.view(features, batch).sum(1))]  # fmt: skip
    indices = torch.cat(ids)
    weights = torch.rand(indices.numel(), generator=gen) if weighted else None
    return LookupBatch(indices, offsets, weights, batch)


class FakeClock:
    """``cpu_shared_lookup._clock``: a step takes ``ms[kernel]`` of the kernel that ran it (the test
    advances ``now`` after each step, from which kernel's lookup was called)."""

    def __init__(self, torch_ms: float, fbgemm_ms: float) -> None:
        self.now, self.ms = 0.0, {"torch": torch_ms / 1000, "fbgemm": fbgemm_ms / 1000}

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(torch_ms=8.0, fbgemm_ms=10.0)
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "auto")  # the suite pins fbgemm
    monkeypatch.setattr(cpu_shared_lookup, "_clock", fake)
    return fake


def _train(kernel: SharedCpuLookup, reference: TorchBatchedLookup, batches: list[LookupBatch], clock: FakeClock,
           gen: torch.Generator) -> list[str]:  # fmt: skip
    """Train both on ``batches``, checking weights and states equal after every step; the kernel of each step."""
    assert kernel.torch_kernel is not None
    ran: list[str] = []
    torch_lookup = kernel.torch_kernel.lookup
    kernel.torch_kernel.lookup = lambda *a: ran.append("torch") or torch_lookup(*a)  # type: ignore[method-assign]
    anchor = torch.zeros(0, requires_grad=True)
    for step, batch in enumerate(batches):
        before = len(ran)
        out = kernel.lookup(batch, [anchor], lambda: 0.05)
        if len(ran) == before:
            ran.append("fbgemm")
        grad = torch.randn(out.shape, generator=gen)
        out.backward(grad)
        reference.lookup(batch, [anchor], lambda: 0.05).backward(grad)
        clock.now += clock.ms[ran[-1]]
        for mine, ref in zip(kernel.split_embedding_weights(), reference.split_embedding_weights(), strict=True):
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6, msg=f"step {step}")
        for mine_st, ref_st in zip(kernel.split_optimizer_states(), reference.split_optimizer_states(), strict=True):
            for name in mine_st:
                torch.testing.assert_close(mine_st[name], ref_st[name], rtol=1e-5, atol=1e-6)
    return ran


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize("dims", [[64], [16, 16, 32]], ids=["one_dim", "two_dims"])
def test_the_torch_kernel_serves_fbgemms_storage_in_place(optimizer: EmbOptimType, dims: list[int]) -> None:
    kernel = SharedCpuLookup(_config(optimizer, dims))
    assert kernel.torch_kernel is not None
    pairs = zip(kernel.split_embedding_weights(), kernel.torch_kernel.split_embedding_weights(), strict=True)
    assert all(a.data_ptr() == b.data_ptr() and a.shape == b.shape for a, b in pairs)
    for mine, theirs in zip(kernel.split_optimizer_states(), kernel.torch_kernel.split_optimizer_states(), strict=True):
        assert mine.keys() == theirs.keys() == set(kernel.spec.state_names)  # type: ignore[union-attr]
        assert all(mine[k].data_ptr() == theirs[k].data_ptr() and mine[k].shape == theirs[k].shape for k in mine)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize(("dims", "pooling", "weighted", "faster"), [
    ([32], PoolingType.SUM, False, "torch"), ([16, 16, 32], PoolingType.SUM, True, "fbgemm"),
    ([16, 32], PoolingType.MEAN, False, "torch"),
], ids=["sum", "mixed_dims_weighted", "mean"])  # fmt: skip
def test_training_through_the_trial_and_after_matches_the_torch_kernel(
    clock: FakeClock, optimizer: EmbOptimType, dims: list[int], pooling: PoolingType, weighted: bool, faster: str
) -> None:
    config = _config(optimizer, dims, pooling)
    kernel, reference = SharedCpuLookup(config), TorchBatchedLookup(config)
    gen = torch.Generator().manual_seed(3)
    for mine, ref in zip(kernel.split_embedding_weights(), reference.split_embedding_weights(), strict=True):
        mine.copy_(torch.rand(mine.shape, generator=gen) - 0.5)
        ref.copy_(mine)
    if faster == "fbgemm":
        clock.ms["torch"] = 1.5 * clock.ms["fbgemm"]
    batches = [_batch(config, 12, [1, 8, 3][step % 3], gen, weighted) for step in range(TRIAL_STEPS + 4)]
    ran = _train(kernel, reference, batches, clock, gen)
    # The trial: 3 warm-up steps per kernel, then blocks of 5 steps, torch, fbgemm, fbgemm, torch, four times;
    # the 86th step's start ends the last timed step, and the faster kernel runs it and every step after.
    blocks = ["torch"] * 5 + ["fbgemm"] * 10 + ["torch"] * 5
    schedule = ["torch"] * 3 + ["fbgemm"] * 3 + blocks * 4
    assert len(schedule) == TRIAL_STEPS
    assert ran[: TRIAL_STEPS - 1] == schedule[:-1] and ran[TRIAL_STEPS - 1 :] == [faster] * 5
    verdict = kernel.verdicts[torch.get_num_threads()]
    assert (verdict.kernel, verdict.reason) == (faster, "trial")
    assert verdict.ms == pytest.approx({"torch": 1000 * clock.ms["torch"], "fbgemm": 1000 * clock.ms["fbgemm"]})


def test_the_trial_times_only_steps_inside_a_block_and_wants_a_clear_win() -> None:
    config = _config(EmbOptimType.ROWWISE_ADAGRAD, [16])

    def run(torch_ms: float, fbgemm_ms: float, skip: frozenset[int] = frozenset(), cold_ms: float = 0.0,
            busy: frozenset[int] = frozenset(), light: frozenset[int] = frozenset()) -> StepTrial:  # fmt: skip
        trial, now, call, seen = StepTrial(), 0.0, 0, {"torch": 0, "fbgemm": 0}
        for step in range(TRIAL_STEPS):
            call += 2 if step in skip else 1  # an evaluation call just before this training step
            kernel = trial.record(call, now, 1.0)
            seen[kernel] += 1
            cold = cold_ms if seen[kernel] <= 3 else 0.0  # a kernel's first steps: page faults, allocator growth
            other_job = 12.0 if step in busy else 0.0  # another job on the machine slows this step
            lighter = 0.5 if step in light else 1.0  # a batch with fewer ids than the others
            now += ((torch_ms if kernel == "torch" else fbgemm_ms) * lighter + cold + other_job) / 1000
        return trial

    trial = run(8.0, 10.0)
    # 3 inner steps of each 5-step torch block (the first and the last), 8 of each 10-step run; fbgemm: 8 of each.
    assert {k: len(v) for k, v in trial.step_ms().items()} == {"torch": 30, "fbgemm": 32}
    verdict = trial.verdict(config)
    assert verdict is not None and verdict.kernel == "torch" and verdict.case is not None
    assert "86 steps (6 warm-up) alternating in blocks of 5, 1.0 ids per bag" in verdict.describe()
    kinds = [step[2] for step in trial.steps]
    torch_steps = [i for i in range(6, len(kinds) - 1) if kinds[i - 1] == kinds[i] == kinds[i + 1] == "torch"]  # timed
    assert len(torch_steps) == 30
    # Another job slowing half of the torch kernel's timed steps does not hide that it is faster (the median
    # of its steps would be 14 ms against fbgemm's 10; the second-fastest is 8).
    busy = run(8.0, 10.0, busy=frozenset(torch_steps[::2])).verdict(config)
    assert busy is not None and busy.kernel == "torch" and busy.ms["torch"] == pytest.approx(8.0)
    # ... nor slowing all but two of them (a slow phase of the machine: the lower quartile would be 20 ms)
    slow_phase = run(8.0, 10.0, busy=frozenset(torch_steps[2:])).verdict(config)
    assert slow_phase is not None and slow_phase.kernel == "torch" and slow_phase.ms["torch"] == pytest.approx(8.0)
    # One torch step that got a batch half as heavy does not make a tie look like a win.
    lucky = run(9.8, 10.0, light=frozenset({torch_steps[3]})).verdict(config)
    assert lucky is not None and lucky.kernel == "fbgemm" and lucky.ms["torch"] == pytest.approx(9.8)
    tie = run(9.8, 10.0).verdict(config)  # 2 % faster is a tie: fbgemm, torchrec's own kernel
    assert tie is not None and tie.kernel == "fbgemm"
    # The warm-up steps are not timed: a kernel slow only in its first three steps is judged on the rest.
    cold = run(8.0, 10.0, cold_ms=50.0)
    assert all(ms < 10.0 for ms in cold.step_ms()["torch"])
    cold_verdict = cold.verdict(config)
    assert cold_verdict is not None and cold_verdict.kernel == "torch"
    # Evaluation calls inside every torch block leave no timed torch step: the trial starts over.
    runs = [i for i in range(6, len(kinds)) if kinds[i] == "torch" and kinds[i - 1] != "torch"]  # first steps
    every_other = {j for a in runs for j in range(a + 2, len(kinds), 2) if kinds[a : j + 1].count("fbgemm") == 0}
    broken = run(8.0, 10.0, skip=frozenset(every_other))
    assert broken.step_ms()["torch"] == [] and broken.verdict(config) is None and broken.steps == []
    assert broken.attempts == 1

    def leaving(keep: set[int]) -> frozenset[int]:
        """Evaluation calls that leave exactly the timed torch steps ``keep`` (a call before step j breaks j-1, j)."""
        skip: set[int] = set()
        for t in torch_steps:
            if t not in keep and t not in skip and t + 1 not in skip:
                skip.add(t + 1 if t - 1 in keep else t)
        return frozenset(skip)

    last_run = torch_steps[-11:-3]  # the last 10-step torch run's 8 timed steps
    two, three = run(8.0, 10.0, skip=leaving(set(last_run[-2:]))), run(8.0, 10.0, skip=leaving(set(last_run[-3:])))
    assert len(two.step_ms()["torch"]) == 2 and two.verdict(config) is None and two.steps == []  # starts over
    assert len(three.step_ms()["torch"]) == 3
    enough = three.verdict(config)
    assert enough is not None and enough.kernel == "torch" and enough.ms["torch"] == pytest.approx(8.0)
    # A loop that never gives 3 training steps in a row: after 3 schedules, fbgemm (nothing could be timed).
    never = StepTrial()
    verdicts = []
    for step in range(3 * TRIAL_STEPS):
        never.record(3 * step, step / 100, 1.0)  # an evaluation call between every two training steps
        verdicts.append(never.verdict(config))
    assert verdicts[: 3 * TRIAL_STEPS - 1] == [None] * (3 * TRIAL_STEPS - 1)
    settled = verdicts[-1]
    assert settled is not None and settled.kernel == "fbgemm" and "never 3 training steps in a row" in settled.detail


def test_a_forward_without_autograd_runs_fbgemm_and_is_not_a_trial_step(clock: FakeClock) -> None:
    config = _config(EmbOptimType.ROWWISE_ADAGRAD, [16])
    kernel = SharedCpuLookup(config)
    batch = _batch(config, 4, 1, torch.Generator().manual_seed(0), False)
    with torch.no_grad():
        assert kernel.kernel_for(batch) is kernel
        out = kernel.lookup(batch, [torch.zeros(0)], lambda: 0.05)
    with torch.inference_mode():
        assert kernel.kernel_for(batch) is kernel
    assert out.shape == (4, 16) and kernel._trials == {}
    assert kernel.kernel_for(batch) is kernel.torch_kernel  # the trial's first step
    assert len(kernel._trials[torch.get_num_threads()].steps) == 1


@pytest.fixture
def deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` for the test (what ``Trainer(deterministic=True)`` sets)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_a_deterministic_run_trains_every_step_with_the_torch_kernel_and_times_nothing(
    clock: FakeClock, optimizer: EmbOptimType, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(optimizer, [16, 32])
    kernel, reference = SharedCpuLookup(config), TorchBatchedLookup(config)  # built before the switch, as a
    gen = torch.Generator().manual_seed(5)  # model is before Trainer(deterministic=True) sets it
    for mine, ref in zip(kernel.split_embedding_weights(), reference.split_embedding_weights(), strict=True):
        mine.copy_(torch.rand(mine.shape, generator=gen) - 0.5)
        ref.copy_(mine)
    clock.ms["torch"] = 1.5 * clock.ms["fbgemm"]  # a trial would keep fbgemm
    batches = [_batch(config, 12, [1, 8][step % 2], gen, False) for step in range(50)]
    with caplog.at_level("INFO", logger=cpu_shared_lookup.__name__):
        torch.use_deterministic_algorithms(True)
        try:
            ran = _train(kernel, reference, batches, clock, gen)
        finally:
            torch.use_deterministic_algorithms(False)
    assert ran == ["torch"] * 50 and kernel._trials == {} and kernel.verdicts == {}
    # _train checked every step equal to the torch kernel's; exactly equal, as the reference update rounds:
    for mine, ref in zip(kernel.split_embedding_weights(), reference.split_embedding_weights(), strict=True):
        assert torch.equal(mine, ref)
    said = [r.getMessage() for r in caplog.records if "deterministic" in r.getMessage()]
    assert len(said) == 1 and "torch: deterministic" in said[0]
    # Off again: the trial starts from its first step.
    assert kernel.kernel_for(batches[0]) is kernel.torch_kernel and len(kernel._trials[torch.get_num_threads()].steps) == 1


def test_a_deterministic_run_builds_the_torch_kernel_unless_the_switch_pins_one(
    monkeypatch: pytest.MonkeyPatch, deterministic: None
) -> None:
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "auto")
    config = _config(EmbOptimType.ROWWISE_ADAGRAD, [16, 16])
    verdict = cpu_fused_choice(config)
    assert (verdict.kernel, verdict.reason) == ("torch", "deterministic") and "use_deterministic_algorithms" in verdict.detail
    assert build_kernel("auto", config)[0] == "torch"
    assert cpu_fused_choice(config, ids_per_bag=8).case == CpuKernelCase.of(config, 8)
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "fbgemm")  # the switch first
    assert (cpu_fused_choice(config).kernel, cpu_fused_choice(config).reason) == ("fbgemm", "forced")


def test_auto_builds_it_only_where_the_storage_can_be_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "auto")
    name, kernel = build_kernel("auto", _config(EmbOptimType.SGD, [16, 16, 32]))
    assert name == "fbgemm|torch" and isinstance(kernel, SharedCpuLookup)
    apart = _config(EmbOptimType.SGD, [16, 32, 16])
    assert shared_storage_refusal(apart) == "the tables of dim 16 ([0, 2]) are not adjacent in table order"
    with pytest.raises(ValueError, match="not adjacent in table order"):
        SharedCpuLookup(apart)
    assert "CPU optimizers" in str(shared_storage_refusal(_config(EmbOptimType.ADAM, [16])))
    monkeypatch.setenv("LIGHTREC_CPU_KERNEL", "torch")  # the switch decides without building both
    assert build_kernel("auto", _config(EmbOptimType.SGD, [16]))[0] == "torch"


def test_the_torch_kernel_refuses_storage_of_the_wrong_shape() -> None:
    config = _config(EmbOptimType.ROWWISE_ADAGRAD, [8, 8])
    total = sum(config.rows)
    good = (torch.zeros(total, 8), {"momentum1": torch.zeros(total)})
    kernel = TorchBatchedLookup(config, storage=[good])
    assert kernel.groups[0].weight is good[0]  # served as given, not copied
    with pytest.raises(ValueError, match=r"states \{'momentum1': \(93,\)\}"):
        TorchBatchedLookup(config, storage=[(good[0], {"momentum1": torch.zeros(total, 8)})])
    with pytest.raises(ValueError, match="one \\(weight, states\\) per dim group \\(1\\), got 2"):
        TorchBatchedLookup(config, storage=[good, good])


def test_a_tiered_tables_cache_is_served_by_both_kernels_too(clock: FakeClock) -> None:
    from lightrec.kernels.tiered.backend import TieredBatchedLookup
    from lightrec.kernels.tiered.config import TieringConfig

    config = dataclasses.replace(_config(EmbOptimType.ROWWISE_ADAGRAD, [16, 16]), tiering=TieringConfig("host"))
    name, kernel = build_kernel("auto", config)
    assert name == "tiered" and isinstance(kernel, TieredBatchedLookup)
    assert isinstance(kernel.inner, SharedCpuLookup) and kernel.inner_name == "fbgemm|torch"
    batch = _batch(config, 8, 1, torch.Generator().manual_seed(1), False)
    kernel.lookup(batch, [torch.zeros(0, requires_grad=True)], lambda: 0.05).sum().backward()
    assert isinstance(kernel.inner, SharedCpuLookup)
    assert len(kernel.inner._trials[torch.get_num_threads()].steps) == 1  # the cache's batch: a trial step


def test_adopting_a_verdict_of_another_kernel_is_refused_and_changes_nothing() -> None:
    from lightrec.kernels.cpu_kernel_choice import CpuKernelVerdict

    kernel = SharedCpuLookup(_config(EmbOptimType.ROWWISE_ADAGRAD, [16]))
    with pytest.raises(ValueError, match=r"verdict.kernel must be 'torch' or 'fbgemm', got 'triton'"):
        kernel.adopt(1, CpuKernelVerdict("triton", "trial"))
    assert kernel.verdicts == {}
    kernel.adopt(1, CpuKernelVerdict("torch", "trial", ms={"torch": 8.0, "fbgemm": 10.0}))
    assert kernel.verdicts[1].kernel == "torch" and kernel.trial_verdict(1) is kernel.verdicts[1]
