"""``lightrec run dlrm_online``: a short run on the drifting stream logs the windowed AUC, and a restart
from its checkpoint trains the next batch of the stream (its losses are the uninterrupted run's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lightrec.recipes.dlrm import main

BATCH = 64
SMALL = ["fit", "--config", "dlrm_online", "--trainer.devices=1",
         "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         f"--data.init_args.batch_size={BATCH}", "--data.init_args.num_embeddings_cap=300",
         "--model.managed_collisions.eviction_interval=2"]  # fmt: skip


def _run(root: Path, *args: str) -> Any:
    return main([*SMALL, f"--trainer.logger.init_args.save_dir={root}", *args])


def _scalars(version: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version), size_guidance={"scalars": 0}).Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("online")
    logs = root / "dlrm_online"
    whole = _run(root, "--trainer.max_steps=6")  # version_0
    _run(root, "--trainer.max_steps=3")  # version_1
    last = logs / "version_1" / "checkpoints" / "last.ckpt"
    _run(root, "--trainer.max_steps=6", f"--ckpt_path={last}")  # version_2
    return {"whole": whole, "logs": logs, "cut": last}


def test_a_short_online_run_trains_behind_managed_collisions_and_logs_the_windowed_auc(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from lightrec.distributed.deltas import DeltaReader
    from lightrec.distributed.mc_embedding_modules import ShardedManagedCollisionEmbeddingBagCollection
    from lightrec.lightning import ProgressiveValidation

    cli = runs["whole"]
    assert cli.trainer.global_step == 6
    collection = cli.model.built_model().sparse_arch.embedding_bag_collection
    assert isinstance(collection, ShardedManagedCollisionEmbeddingBagCollection)
    # DeltaPublisher: a snapshot at the start and a last version at the end, in the run's log folder
    publish = runs["logs"] / "version_0" / "publish"
    assert DeltaReader(publish).latest() is not None and (publish / "v000000001").is_dir()
    auc = _scalars(runs["logs"] / "version_0", "online/auc")
    assert sorted(auc) == list(range(6)) and all(0.0 <= v <= 1.0 for v in auc.values())
    assert sorted(_scalars(runs["logs"] / "version_0", "online/ne")) == list(range(6))
    (progressive,) = [c for c in cli.trainer.callbacks if isinstance(c, ProgressiveValidation)]
    assert progressive.last_metrics["online/auc"] == pytest.approx(auc[5])
    assert not any(k.startswith("test/") for k in cli.trainer.callback_metrics)  # a stream has no test split
    from lightrec.lightning.recipe.cli import summarize

    assert f"online (last window): auc={auc[5]:.4f}" in summarize(cli.trainer, cli.datamodule, tested=False)


def test_a_restart_from_the_checkpoint_continues_at_the_next_batch(runs: dict[str, Any]) -> None:
    # RecStrategy's checkpoint is a folder; its meta.pt holds Lightning's loop state
    state = torch.load(runs["cut"] / "meta.pt", map_location="cpu", weights_only=True)
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["samples"] == 3 * BATCH
    reference = _scalars(runs["logs"] / "version_0", "train/loss")
    resumed = _scalars(runs["logs"] / "version_2", "train/loss")
    assert sorted(resumed) == [3, 4, 5]
    for step in resumed:  # the same batches on the same restored weights, id maps and optimizer state
        assert resumed[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6)


def test_the_online_recipe_follows_a_parquet_folder(tmp_path: Path) -> None:
    from tests.data.parquet.test_resume import write_rows

    write_rows(tmp_path / "events")  # 270 rows in 3 files: 8 batches of 32
    cli = _run(tmp_path, "--trainer.max_steps=4", "--data", "parquet", f"--data.path={tmp_path / 'events'}",
               "--data.label=label", "--data.dense=[int_*]", "--data.follow=true", "--data.poll_interval=0.1",
               "--data.idle_timeout=30", "--data.batch_size=32", "--data.num_embeddings=300")  # fmt: skip
    assert cli.trainer.global_step == 4 and type(cli.datamodule).__name__ == "ParquetDataModule"
    assert sorted(_scalars(tmp_path / "dlrm_online" / "version_0", "online/auc")) == [0, 1, 2, 3]


def _run_ranks(root: Path, *args: str) -> None:
    import os
    import subprocess
    import sys

    from tests.multiprocess import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm_online", "--devices", "2", *SMALL[4:],
           f"--trainer.logger.init_args.save_dir={root}", *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "sparse-dist-prefetch"])
def test_two_sharded_ranks_resume_the_stream_at_the_next_batch(tmp_path: Path, prefetch: bool) -> None:
    """Resumed from a checkpoint taken mid-run (step 3 of 6). With ``SparseDistPrefetch`` the next batch
    was already read (and its input dist started) when it was taken: the stream position must leave
    that batch out, or the resumed fit would skip it."""
    logs = tmp_path / "dlrm_online"
    every_3 = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_top_k=-1",
               "--trainer.callbacks.every_n_train_steps=3", f"--trainer.callbacks.dirpath={tmp_path / 'every_3'}"]
    extra = [*every_3, *(["--trainer.callbacks+=lightrec.lightning.SparseDistPrefetch"] if prefetch else [])]
    _run_ranks(tmp_path, "--trainer.max_steps=6", *extra)  # version_0
    _run_ranks(tmp_path, "--trainer.max_steps=6", f"--ckpt_path={tmp_path / 'every_3' / 'epoch=0-step=3.ckpt'}",
               *extra)  # version_1; fmt: skip
    reference, resumed = _scalars(logs / "version_0", "train/loss"), _scalars(logs / "version_1", "train/loss")
    assert sorted(resumed) == [3, 4, 5]
    assert all(resumed[s] == pytest.approx(reference[s], rel=1e-5, abs=1e-6) for s in resumed)
    assert sorted(_scalars(logs / "version_0", "online/auc")) == list(range(6))


def test_sigterm_while_the_followed_folder_waits_stops_at_once_and_a_checkpoint_at_the_stop_resumes(
    tmp_path: Path,
) -> None:
    """A scheduler stops the job (SIGTERM) while no file lands: the run ends within seconds, not after
    ``idle_timeout`` (here: never), without finishing the epoch, so a checkpoint taken at the stop
    (``OnExceptionCheckpoint``) resumes the stream: the batch Lightning had read ahead first, then new files."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from tests.data.parquet.test_resume import write_rows

    write_rows(tmp_path / "events")  # 270 rows in 3 files: 8 batches of 32, 14 rows left over
    body = "import logging, sys; logging.basicConfig(level=logging.INFO); from recipes.dlrm import main; main(sys.argv[1:])"
    root = Path(__file__).resolve().parents[2]
    common = [*SMALL, f"--trainer.logger.init_args.save_dir={tmp_path}", "--data", "parquet",
              f"--data.path={tmp_path / 'events'}", "--data.label=label", "--data.dense=[int_*]", "--data.follow=true",
              "--data.batch_size=32", "--data.num_embeddings=300", "--data.id_mapping=managed",
              "--trainer.callbacks+=lightning.pytorch.callbacks.OnExceptionCheckpoint",
              f"--trainer.callbacks.dirpath={tmp_path / 'stop'}"]  # fmt: skip
    cmd = [sys.executable, "-c", body, *common, "--data.poll_interval=60", "--data.idle_timeout=null"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # until the loader waits for a file (the last batch is held read ahead)
            lines.append(line)
            if "waiting for new files" in line or time.monotonic() > deadline:
                break
        assert any("waiting for new files" in line for line in lines), "".join(lines[-40:])
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        rest = proc.communicate(timeout=60)[1]
        waited = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert waited < 30, f"{waited:.0f} s after SIGTERM"  # one poll is 60 s and idle_timeout is never
    # 7 batches trained; the 8th was read ahead, untrained, and stays in the checkpoint's position
    assert sorted(_scalars(tmp_path / "dlrm_online" / "version_0", "train/loss")) == list(range(7)), rest[-3000:]
    shutil.copy(tmp_path / "events" / "part-0.parquet", tmp_path / "events" / "part-3.parquet")  # 90 more rows
    _run(tmp_path, *common[len(SMALL) + 1 :], "--data.poll_interval=0.2", "--data.idle_timeout=2",
         f"--ckpt_path={tmp_path / 'stop' / 'on_exception.ckpt'}")  # fmt: skip
    # the held batch (step 7), then 14 + 90 rows: 3 batches
    assert sorted(_scalars(tmp_path / "dlrm_online" / "version_1", "train/loss")) == [7, 8, 9, 10]


def test_steps_trained_before_the_followed_folder_waits_are_published_while_it_waits(tmp_path: Path) -> None:
    """``every_seconds`` comes while no file lands: ``DeltaPublisher.on_data_wait`` publishes the 7 steps trained
    (the 8th batch is Lightning's read-ahead), instead of leaving them for the version at the end."""
    from lightrec.distributed.deltas import DeltaReader
    from tests.data.parquet.test_resume import write_rows

    write_rows(tmp_path / "events")  # 270 rows in 3 files: 8 batches of 32
    _run(tmp_path, "--data", "parquet", f"--data.path={tmp_path / 'events'}", "--data.label=label",
         "--data.dense=[int_*]", "--data.follow=true", "--data.poll_interval=0.2", "--data.idle_timeout=6",
         "--data.batch_size=32", "--data.num_embeddings=300", "--data.id_mapping=managed",
         "--trainer.callbacks.init_args.every_seconds=2")  # fmt: skip
    reader = DeltaReader(tmp_path / "dlrm_online" / "version_0" / "publish")
    steps = [reader.manifest(v).global_step for v in reader.versions()]
    assert steps[0] == 0 and steps[-1] == 8, steps  # the snapshot at the start, the last version at the end
    assert 7 in steps, steps  # published during the wait, before the end trained the read-ahead batch


@pytest.mark.slow  # ~25 s: two ranks start and train until stopped
def test_sigterm_on_two_ranks_lets_the_version_in_flight_land(tmp_path: Path) -> None:
    """2 ranks publishing every step, stopped by SIGTERM mid-stream: the version the last step's end queued is
    waited for (``abort`` alone dropped it: the folder ended at the step before the last one trained)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from lightrec.distributed.deltas import DeltaReader
    from tests.multiprocess import free_port

    publish = tmp_path / "dlrm_online" / "version_0" / "publish"
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm_online", "--devices", "2", *SMALL[4:],
           f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_steps=100000",
           "--trainer.callbacks.init_args.every_n_steps=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def steps() -> list[int]:
        try:
            reader = DeltaReader(publish)
            return [reader.manifest(v).global_step for v in reader.versions()]
        except Exception:  # noqa: BLE001 -- not there yet
            return []

    try:
        deadline = time.monotonic() + 300
        while len(steps()) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(steps()) >= 5, steps()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    trained = max(_scalars(tmp_path / "dlrm_online" / "version_0", "train/loss")) + 1  # global steps done
    assert steps()[-1] == trained, (steps()[-3:], trained, rest[-3000:])
