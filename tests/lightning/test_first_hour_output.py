"""What a new user sees (issue 16, items 5 and 6): the plan chart's axes, logging that prints each
line once without touching the user's own set-up, and the model summary of fused tables."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from lightrec.distributed.planner import PlannerReport


def _report(compute_device: str, used_mib: list[float], cap_gib: float) -> PlannerReport:
    w = len(used_mib)
    used, zeros, caps = np.array(used_mib) * 2**20, np.zeros(w), np.full(w, cap_gib * 2**30)
    on_gpu = compute_device == "cuda"
    return PlannerReport(
        compute_device=compute_device,
        hbm_bytes=used if on_gpu else zeros,
        ddr_bytes=zeros if on_gpu else used,
        hbm_caps=caps if on_gpu else zeros,
        ddr_caps=caps,
        cost_s=np.linspace(6e-4, 7e-4, w),
    )


def test_chart_has_integer_rank_ticks_and_an_axis_scaled_to_the_data() -> None:
    from lightrec.distributed.planner.report import plan_chart

    fig = plan_chart(_report("cpu", [29.4, 28.7], cap_gib=128))
    memory, cost = fig.axes
    assert list(cost.get_xticks()) == [0, 1]  # no -0.5, -0.25, ... ticks
    assert memory.get_ylabel() == "MiB" and 29.4 < memory.get_ylim()[1] < 2 * 29.4
    assert "cap 128 GiB per rank, off the scale" in memory.get_title()
    assert [t.get_text() for t in memory.get_legend().get_texts()] == ["DDR"]  # no empty HBM bars
    assert 0.7 < cost.get_ylim()[1] < 1.0  # ms, scaled to the costs


def test_chart_of_a_gpu_plan_shows_hbm_and_a_near_cap() -> None:
    from lightrec.distributed.planner.report import plan_chart

    fig = plan_chart(_report("cuda", [30_000.0, 31_000.0, 29_000.0, 30_500.0], cap_gib=40))
    memory, cost = fig.axes
    assert list(cost.get_xticks()) == [0, 1, 2, 3]
    assert memory.get_ylabel() == "GiB"
    assert sorted(t.get_text() for t in memory.get_legend().get_texts()) == ["HBM", "cap"]  # the cap is drawn


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_fbgemm_leaves_the_root_logger_alone() -> None:
    """fbgemm_gpu's import calls logging.basicConfig(DEBUG): every Lightning INFO line then printed twice."""
    from lightrec._fbgemm import fbgemm_available

    if not fbgemm_available():  # absent, blocked, or built for another torch (it then raises OSError)
        pytest.skip("fbgemm_gpu cannot be loaded beside this torch")
    done = _run(
        "import logging\n"
        "from lightrec._fbgemm import fbgemm_available\n"
        "assert fbgemm_available()\n"
        "print(len(logging.getLogger().handlers), logging.getLogger().level)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", str(30)]  # no handler added, level WARNING as before
    # A user who configured logging first keeps exactly their set-up.
    done = _run(
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='mine %(message)s')\n"
        "from lightrec._fbgemm import fbgemm_available\n"
        "fbgemm_available()\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), root.level, root.handlers[0].formatter._fmt)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "20", "mine", "%(message)s"]


def test_lightning_info_lines_print_once() -> None:
    done = _run(
        "import lightrec.lightning\n"
        "from lightrec._fbgemm import fbgemm_available\n"
        "fbgemm_available()\n"
        "import lightning.pytorch as pl\n"
        "pl.seed_everything(3)\n"
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "Seed set to 3" in line]
    assert lines == ["Seed set to 3"]


def test_known_third_party_warnings_are_silenced_once() -> None:
    done = _run(
        "import warnings\n"
        "warnings.simplefilter('default')\n"
        "import lightrec.lightning\n"
        "import torch\n"
        "from lightrec.sparse import KeyedJaggedTensor\n"
        "from torch.utils._pytree import LeafSpec\n"
        "KeyedJaggedTensor(keys=['a'], values=torch.tensor([1]), lengths=torch.tensor([1]))\n"
        "LeafSpec()\n"
    )
    assert done.returncode == 0, done.stderr
    assert "is_fx_tracing" not in done.stderr and "LeafSpec" not in done.stderr


def test_model_summary_counts_whole_fused_tables_as_trainable() -> None:
    from torch import nn

    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.lightning.callbacks.rec_model_summary import count_embedding_parameters
    from lightrec.modules import EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=100, embedding_dim=4, feature_names=[f"f{i}"])
        for i in range(2)
    ]
    import torch

    fused = FusedEmbeddingBagCollection(tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    model = nn.Sequential(fused, nn.Linear(8, 1))
    counted = count_embedding_parameters(model)
    assert counted.whole == counted.local == 800 and counted.extra_for("") == 0
