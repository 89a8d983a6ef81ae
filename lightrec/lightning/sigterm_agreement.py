"""SIGTERM stops every rank after the same training step: the handler notes the signal, the ranks agree.

Lightning 2.6's SIGTERM handler (``_SignalConnector._sigterm_notifier_fn``) broadcasts on the default group
from inside the handler, and each rank then stops when its own ``trainer.received_sigterm`` is set. A
Python handler runs wherever the signal interrupts the main thread: in the middle of another collective
(a metric's ``barrier``, a gradient all-reduce), or on one rank only (a signal to one process, or a
second one that rank 0 forwards to its children while the first is still being handled). The ranks'
collectives then stop matching, and the job hangs until the group's timeout or fails with "Connection
closed by peer" (``tests/lightning/test_sigterm_agreement.py`` reproduces both; so did 1 in 5 runs of
the online recipe's SIGTERM test).

``RecStrategy`` replaces the trainer's connector with :class:`AgreedSigtermConnector`:

* the handler makes no collective: it forwards the signal to the launcher's child ranks (as Lightning
  does) and notes it (``lightrec._stop_signal``);
* at every training batch's start every rank calls :meth:`AgreedSigtermConnector.agree`: one all-reduce
  (max) of the noted flags on the ranks' gloo group (``lightrec.data.parquet.ranks.data_group``); if any
  rank noted the signal, every rank's ``received_sigterm`` turns true at that point, and Lightning's
  loops raise ``SIGTERMException`` on every rank at that batch's end -- the same step everywhere;
* ``ParquetDataModule``, waiting for files with no batch to start, reads the noted flag directly
  (the ranks agree on it at each poll of the wait: ``lightrec.data.parquet.ranks.any_rank``).

The cost is one all-reduce of one integer per training step, beside the broadcast Lightning makes there
already: 0.23 ms on two gloo ranks of a 2-core VM (a 2-rank DLRM recipe step there takes ~100 ms).
"""

from __future__ import annotations

import logging
from types import FrameType

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.rank_zero import rank_prefixed_message

from lightrec._stop_signal import forget_sigterm, note_sigterm, sigterm_noted
from lightrec.data.parquet.ranks import data_group, distributed
from lightrec.distributed.comm.failures import collective_guard

__all__ = ["AgreedSigtermConnector", "install_agreed_sigterm"]

_log = logging.getLogger(__name__)


class AgreedSigtermConnector(_SignalConnector):
    """Lightning's signal connector, with a SIGTERM handler that makes no collective (see the module doc).

    ``received_sigterm`` -- what Lightning's loops read -- changes only in :meth:`agree`, which every rank
    calls at the same point; everything else (SIGUSR1 / Slurm requeueing, restoring the handlers at
    teardown) is Lightning's.
    """

    def register_signal_handlers(self) -> None:
        forget_sigterm()  # a signal that stopped an earlier fit in this process is not this fit's
        super().register_signal_handlers()

    def _sigterm_notifier_fn(self, signum: object, _: FrameType | None) -> None:
        _log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", self.trainer.local_rank))
        if not sigterm_noted():
            launcher = self.trainer.strategy.launcher
            if launcher is not None:  # rank 0 of Lightning's subprocess launcher signals its child ranks
                launcher.kill(signum)  # type: ignore[arg-type]
        note_sigterm()

    def agree(self) -> bool:
        """Every rank's ``received_sigterm`` becomes true if any rank noted SIGTERM; call on every rank at the
        same point (``RecStrategy.on_train_batch_start``). Returns the agreed flag."""
        if self.received_sigterm:
            return True
        noted = sigterm_noted()
        if distributed():
            flag = torch.tensor([int(noted)], dtype=torch.int32)
            group = data_group()  # gloo whatever the training backend (the flag is a CPU tensor); made once
            with collective_guard("the ranks' agreement on SIGTERM at a training batch's start", group):
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)  # a dead peer: an error naming it
            noted = bool(flag.item())
        self.received_sigterm = noted
        return noted

    def teardown(self) -> None:
        super().teardown()
        forget_sigterm()


def install_agreed_sigterm(trainer: pl.Trainer) -> AgreedSigtermConnector:
    """Give ``trainer`` an :class:`AgreedSigtermConnector` (before it registers its handlers, which happens
    after the strategy's ``setup``) and return it; a trainer that has one keeps it."""
    connector = trainer._signal_connector
    if not isinstance(connector, AgreedSigtermConnector):
        connector = AgreedSigtermConnector(trainer)
        trainer._signal_connector = connector
    return connector
