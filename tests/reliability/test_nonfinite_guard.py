"""Deliver 7: a NaN loss is refused before backward, where the fused optimizer would write it into the tables.

Before: one NaN batch made every table NaN (the fused optimizer updates rows inside backward,
before any hook could refuse the step). Now ``RecModule(nonfinite_loss=...)`` checks the loss
first: ``"raise"`` stops with ``NonFiniteLossError`` and no weight changed; ``"skip"`` trains
exactly as if the batch were not in the data; two real gloo ranks with a NaN on one rank only take
the same decision (no hang).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from tests.lightning.test_rank_failure import _launch
from tests.reliability.torchrun_rank import run_as_torchrun_rank

NAN_AT = 2


def _module_class() -> type:
    from lightrec.lightning import RecModule
    from lightrec.models import DLRM
    from tests.lightning.toy import DIM, toy_data

    class TableDLRM(RecModule):  # tables built by RecModule: fused optimizer (sharded or not)
        def table_configs(self) -> list:
            return toy_data().table_configs(DIM)

        def build_model(self, embedding_bag_collection: Any) -> Any:
            torch.manual_seed(7)
            return DLRM(embedding_bag_collection, 13, [16, DIM], [16, 1])

        def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
            return self.model(dense, sparse)

    return TableDLRM


def _batches(nan_at: int | None, drop: int | None = None) -> list[Any]:
    from tests.lightning.toy import toy_data

    data = toy_data(batch_size=32, num_train_batches=6)
    data.setup("fit")
    batches = list(data.train_dataloader())
    if nan_at is not None:
        batches[nan_at].dense_features[0, 0] = float("nan")
    return [b for i, b in enumerate(batches) if i != drop]


def _fit(policy: str | None, batches: list[Any]) -> Any:
    import lightning.pytorch as pl

    torch.manual_seed(0)
    module = _module_class()(dense_optimizer="adagrad", nonfinite_loss=policy)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda b: b)
    trainer.fit(module, train_dataloaders=loader)
    return module


def _weights(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def test_raise_stops_before_any_weight_changes() -> None:
    from lightrec.lightning import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match=r"not finite on rank\(s\) \[0\] at global step 2"):
        _fit("raise", _batches(NAN_AT))


def test_skip_trains_exactly_as_without_the_batch() -> None:
    skipped = _fit("skip", _batches(NAN_AT))
    reference = _fit("skip", _batches(None, drop=NAN_AT))
    assert skipped.skipped_nonfinite_batches == 1 and reference.skipped_nonfinite_batches == 0
    got, want = _weights(skipped), _weights(reference)
    assert all(torch.isfinite(v).all() for v in got.values())
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


def test_without_the_check_one_nan_batch_poisons_the_tables() -> None:
    module = _fit(None, _batches(NAN_AT))  # the failure the guard prevents
    tables = {k: v for k, v in _weights(module).items() if "embedding_bags" in k}
    assert tables and any(not torch.isfinite(v).all() for v in tables.values())


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="nonfinite_loss must be 'raise', 'skip' or None"):
        _module_class()(nonfinite_loss="ignore")


# ------------------------------------------------------------------------------ two gloo ranks
def _rank_main(rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any) -> None:
    run_as_torchrun_rank(rank, world_size, port, reports, lambda: _train_with_a_nan(world_size, how, tmp))


def _train_with_a_nan(world_size: int, how: str, tmp: str) -> str:
    from datetime import timedelta

    import lightning.pytorch as pl

    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import toy_data

    class NanOnOneRank(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx == NAN_AT and trainer.global_rank == 1:
                batch.dense_features[0, 0] = float("nan")

    module = _module_class()(dense_optimizer="sgd", dense_lr=0.1, nonfinite_loss=how)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=5, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(timeout=timedelta(seconds=30)), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[NanOnOneRank()], default_root_dir=tmp,
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=16))
    finite = all(bool(torch.isfinite(s).all()) for s in _local_shards(module))
    return json.dumps([module.skipped_nonfinite_batches, finite])


def _local_shards(module: Any) -> list[torch.Tensor]:
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    out = []
    for value in module.model.state_dict().values():
        if isinstance(value, ShardedTableState):
            out += [t for _, t in value.shards]
        elif isinstance(value, torch.Tensor):
            out.append(value)
    return out


# ~11 s each (2 real ranks): the default suite keeps "raise"; "skip" trains as without the batch above
@pytest.mark.parametrize("how", ["raise", pytest.param("skip", marks=pytest.mark.slow)])
def test_two_ranks_agree_on_a_nan_seen_by_one(tmp_path, how: str) -> None:  # noqa: ANN001
    run = _launch(2, -1, how, str(tmp_path), target=_rank_main)
    assert set(run["reports"]) == {0, 1}, run  # neither rank hung
    for rank, (status, text, _) in run["reports"].items():
        if how == "raise":
            assert status == "raised" and text.startswith("NonFiniteLossError: the training loss is not finite on "
                                                          "rank(s) [1]"), text[:2000]  # fmt: skip
        else:
            assert status == "finished", text[-3000:]
            skipped, finite = json.loads(text)
            assert skipped == 1 and finite, (rank, skipped, finite)
