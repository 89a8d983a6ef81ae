"""``Trainer(precision="bf16-mixed")``: the dense layers run under autocast, the tables stay fp32.

lightrec's dense blocks route their eager backward through custom autograd functions (the layout-aware
linear of ``modules/mlp.py``, the one-``bmm`` interaction of ``modules/interaction.py``); under autocast
those would meet a bf16 gradient and the fp32 tensors they saved, so they step aside there and the stock
ops (whose autograd handles the casts) run. Compared exactly with the stock ops under the same autocast.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from lightrec.modules.interaction import InteractionArch, _dot_interaction
from lightrec.modules.mlp import MLP
from tests.lightning.toy import ToyDLRM, toy_data
from tests.multiprocess import free_port, run_ranks, set_torchrun_env

BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}


def test_an_mlp_under_bf16_autocast_trains_as_stock_linear_layers_do() -> None:
    torch.manual_seed(0)
    mlp = MLP(24, [80, 16])  # 64 x 24 @ 24 x 80 takes the layout-aware product outside autocast
    reference = nn.Sequential(nn.Linear(24, 80), nn.ReLU(), nn.Linear(80, 16), nn.ReLU())
    for i, layer in enumerate(mlp._mlp):  # reference[0], reference[2]: the linear layers
        reference[2 * i].load_state_dict(layer.linear.state_dict())
    x = torch.randn(64, 24)
    outs, grads = [], []
    for model in (mlp, reference):
        model.zero_grad()
        with torch.autocast(**BF16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        outs.append(out)
        grads.append([p.grad for p in model.parameters()])
    assert torch.equal(outs[0], outs[1])
    for mine, ref in zip(*grads, strict=True):
        assert mine is not None and mine.dtype == torch.float32 and torch.equal(mine, ref)


def test_the_dot_interaction_under_bf16_autocast_trains_as_the_plain_ops_do() -> None:
    torch.manual_seed(1)
    arch = InteractionArch(num_sparse_features=5)
    dense = torch.randn(32, 8, dtype=torch.bfloat16, requires_grad=True)  # a bf16 MLP's output
    sparse = torch.randn(32, 5, 8, requires_grad=True)  # the fp32 embeddings
    results = []
    for fn in (lambda d, s: arch(d, s), lambda d, s: _dot_interaction(d, s, arch.triu_flat)):
        d, s = dense.detach().requires_grad_(), sparse.detach().requires_grad_()
        with torch.autocast(**BF16):
            out = fn(d, s)
        out.float().sum().backward()
        results.append((out, d.grad, s.grad))
    for mine, ref in zip(*results, strict=True):
        assert torch.equal(mine, ref)
    assert results[0][2].dtype == torch.float32  # the embeddings' gradient in their own dtype


def _fit(precision: str) -> list[float]:
    losses: list[float] = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    module = ToyDLRM(dense_lr=0.05)
    first_linear = module.model.dense_arch.model._mlp[0]._linear
    seen: list[torch.dtype] = []
    first_linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=8, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[Record()],
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data())
    tables = module.model.sparse_arch.embedding_bag_collection.embedding_bags
    assert all(t.weight.dtype == torch.float32 for t in tables.values())
    assert set(seen) == {torch.bfloat16 if precision == "bf16-mixed" else torch.float32}
    return losses


def test_a_rec_module_fits_with_bf16_mixed_precision_close_to_fp32() -> None:
    fp32, bf16 = _fit("32-true"), _fit("bf16-mixed")
    assert len(bf16) == 8 and all(torch.isfinite(torch.tensor(bf16)))
    assert bf16 == pytest.approx(fp32, rel=5e-2)  # bf16 keeps ~3 significant digits


def _fit_on_ranks(rank: int, world_size: int, port: int, tmp: str) -> list[float]:
    set_torchrun_env(rank, world_size, port)
    from lightrec.lightning import RecStrategy

    losses: list[float] = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=4, precision="bf16-mixed", num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Record()], default_root_dir=tmp,
        strategy=RecStrategy(fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
    )  # fmt: skip
    trainer.fit(ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1),
                datamodule=toy_data(batch_size=64 // world_size, num_train_batches=4 * world_size))  # fmt: skip
    t = torch.tensor(losses)
    torch.distributed.all_reduce(t)
    return (t / world_size).tolist()


@pytest.mark.slow  # 1 and 2 gloo ranks (~10 s)
def test_rec_strategy_trains_sharded_tables_with_bf16_mixed_dense_layers(tmp_path) -> None:  # noqa: ANN001
    one = run_ranks(_fit_on_ranks, 1, args=(free_port(), str(tmp_path)), timeout=240)[0]
    two = run_ranks(_fit_on_ranks, 2, args=(free_port(), str(tmp_path)), timeout=240)
    assert two[0] == pytest.approx(two[1]) and len(one) == 4
    assert all(torch.isfinite(torch.tensor(two[0])))
    assert two[0] == pytest.approx(one, rel=5e-2)
