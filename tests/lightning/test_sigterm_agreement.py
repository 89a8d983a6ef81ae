"""A SIGTERM stops every rank at the same step (``lightrec.lightning.sigterm_agreement``).

Lightning's own handler broadcasts from inside the signal handler, at whatever point the signal interrupts the
rank -- possibly in the middle of another collective, or on one rank only -- and each rank then stops when its own
flag is set. The ranks' collectives stop matching and the job hangs until the group's timeout. RecStrategy's
connector only notes the signal; the ranks agree at the start of a training batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightrec import _stop_signal
from tests.multiprocess import free_port

REPO = Path(__file__).resolve().parents[2]

# The signal is sent from a callback, at a set step, to the ranks named in SIGNAL_RANKS only; every rank writes
# how its fit ended to its own file (both ranks' prints share the pipe).
_SCRIPT = textwrap.dedent(
    """
    import os, signal
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    RANK = int(os.environ.get("LOCAL_RANK", "0"))
    LOG = os.path.join(os.environ["FIT_ROOT"], f"rank{RANK}.log")
    SIGNAL_RANKS = {int(r) for r in os.environ["SIGNAL_RANKS"].split(",")}

    def _note(line):
        with open(LOG, "a") as f:
            f.write(line + "\\n")

    class SignalAtStep(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3 and RANK in SIGNAL_RANKS:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=40, max_epochs=-1, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(timeout=__import__("datetime").timedelta(seconds=40)), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.environ["FIT_ROOT"], callbacks=[SignalAtStep()],
    )
    try:
        trainer.fit(ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1), datamodule=toy_data(batch_size=32))
        _note(f"finished at step {trainer.global_step}")
    except SIGTERMException:
        _note(f"stopped at step {trainer.global_step}")
    """
)


def _fit_with_sigterm(tmp_path: Path, signal_ranks: str) -> tuple[list[str], str]:
    """Run the 2-rank fit; what each rank noted and the job's output. A hung job is killed after 120 s."""
    script = tmp_path / "fit.py"
    script.write_text(_SCRIPT)
    env = {
        **os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "FIT_ROOT": str(tmp_path),
        "SIGNAL_RANKS": signal_ranks, "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):  # the launcher sets them for the ranks
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output = proc.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # rank 1 is a child of the launcher: the whole session goes
        output = proc.communicate()[0]
        output = "the job hung and was killed after 120 s\n" + output
    notes = []
    for rank in (0, 1):
        log = tmp_path / f"rank{rank}.log"
        notes.append(log.read_text().strip() if log.exists() else f"rank {rank} noted nothing")
    return notes, output


@pytest.mark.parametrize(
    "signal_ranks",
    ["1", pytest.param("0,1", marks=pytest.mark.slow)],  # ~13 s each: the default suite keeps one
    ids=["rank_1_only", "both_ranks"],
)
def test_a_sigterm_stops_both_ranks_after_the_same_step(tmp_path: Path, signal_ranks: str) -> None:
    """Sent to rank 1 alone, Lightning's handler broadcast on rank 1 only and hung; sent to both at the same
    step, it broadcast from inside a step on both. The ranks now agree at the next batch's start and stop after
    that batch (step 3's end notes the signal, the 4th batch is trained, then both stop at global step 4)."""
    notes, output = _fit_with_sigterm(tmp_path, signal_ranks)
    assert notes == ["stopped at step 4", "stopped at step 4"], output[-4000:]


def test_the_handler_only_notes_and_a_fit_forgets_an_earlier_signal() -> None:
    _stop_signal.forget_sigterm()
    assert not _stop_signal.sigterm_noted()
    _stop_signal.note_sigterm()
    assert _stop_signal.sigterm_noted()
    _stop_signal.forget_sigterm()
    assert not _stop_signal.sigterm_noted()


def test_the_connector_pickles() -> None:
    """The trainer travels to spawned ranks pickled (``ddp_spawn``), its connector with it."""
    import pickle

    import lightning.pytorch as pl

    from lightrec.lightning.sigterm_agreement import AgreedSigtermConnector, install_agreed_sigterm

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    connector = install_agreed_sigterm(trainer)
    assert install_agreed_sigterm(trainer) is connector and trainer._signal_connector is connector
    copy = pickle.loads(pickle.dumps(connector))
    assert isinstance(copy, AgreedSigtermConnector)


def test_one_process_notes_the_signal_and_agrees_with_itself() -> None:
    import signal

    import lightning.pytorch as pl

    from lightrec.lightning.sigterm_agreement import install_agreed_sigterm

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    connector = install_agreed_sigterm(trainer)
    before = signal.getsignal(signal.SIGTERM)
    connector.register_signal_handlers()
    try:
        assert connector.agree() is False and trainer.received_sigterm is False
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the handler Lightning composed, called as by a signal
        assert _stop_signal.sigterm_noted() and trainer.received_sigterm is False  # noted, not yet agreed
        assert connector.agree() is True and trainer.received_sigterm is True
    finally:
        connector.teardown()  # Lightning's handlers back, the note forgotten
    assert not _stop_signal.sigterm_noted() and signal.getsignal(signal.SIGTERM) == before
