"""Quantized communication (fbgemm_qcomm_codec) through the sharders on 2 gloo ranks: fp16/bf16 send
half the bytes of fp32 in the pooled all-to-all and reduce-scatter (forward and backward), and the
outputs and trained tables stay within each precision's error of fp32 communication."""

from __future__ import annotations

import pytest
import torch

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from lightrec.distributed.comm.qcomm import RowCodec
from lightrec.distributed.fbgemm_qcomm_codec import CommOp, CommType, QCommsConfig, get_qcomm_codecs_registry
from tests.multiprocess import run_ranks

FEATURES = ["f0", "f1", "f2", "f3"]
# max relative error of the outputs against fp32 communication
TOLERANCE = {"fp16": 2e-3, "bf16": 2e-2, "fp8": 0.15, "int8": 3e-2}


def _ebc() -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection([EmbeddingBagConfig(name=f"t{i}", num_embeddings=50, embedding_dim=16,
                                                      feature_names=[f]) for i, f in enumerate(FEATURES)])  # fmt: skip


def _kjt(rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(rank)
    lengths = torch.randint(1, 4, (len(FEATURES) * 8,), generator=g)
    return KeyedJaggedTensor(keys=FEATURES, values=torch.randint(0, 50, (int(lengths.sum()),), generator=g),
                             lengths=lengths)  # fmt: skip


def _wire_bytes(calls: list[torch.Tensor]) -> int:
    """Bytes of the embedding collectives (float or encoded rows; the KJT exchanges send ints)."""
    return sum(t.numel() * t.element_size() for t in calls if t.dtype in (torch.float32, torch.uint8))


def _body(rank: int, world_size: int) -> dict:
    import os

    import torch.distributed as dist

    # The bytes are counted on gloo's wire; plain float32 exchanges of one host would otherwise go
    # through the shared-memory transport (encoded ones never do: comm/pooled_all_to_all.py).
    os.environ["LIGHTREC_SHM"] = "0"

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.comm import _primitives
    from lightrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )

    calls: list[torch.Tensor] = []
    real, real_gather = dist.all_to_all_single, _primitives.all_gather_single

    def recording(output: torch.Tensor, input: torch.Tensor, *args: object, **kwargs: object) -> object:
        calls.append(input)
        return real(output, input, *args, **kwargs)

    def recording_gather(output: torch.Tensor, input: torch.Tensor, *args: object, **kwargs: object) -> object:
        calls.append(input)
        return real_gather(output, input, *args, **kwargs)

    out = {}
    for kind in ("fp32", *TOLERANCE):
        registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=kind, backward_precision=kind))
        ebc = _ebc()
        plan = construct_module_sharding_plan(
            ebc, {"t0": table_wise(0), "t1": table_wise(1), "t2": row_wise(), "t3": column_wise(ranks=[0, 1])},
            world_size=world_size,
        )  # fmt: skip
        sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": 1.0},
                                                kernel_backend="torch", qcomm_codecs_registry=registry)  # fmt: skip
        sharded = sharder.shard(ebc, plan, ShardingEnv.from_process_group(None), torch.device("cpu"))
        features = _kjt(rank)
        calls.clear()
        dist.all_to_all_single, _primitives.all_gather_single = recording, recording_gather
        try:
            values = sharded(features).wait().values()
            forward_bytes = _wire_bytes(calls)
            (values * torch.linspace(-1, 1, values.shape[1])).sum().backward()
        finally:
            dist.all_to_all_single, _primitives.all_gather_single = real, real_gather
        from lightrec.distributed import gather_full_state_dict

        out[kind] = {"values": values.detach(), "forward_bytes": forward_bytes, "bytes": _wire_bytes(calls),
                     "tables": gather_full_state_dict(sharded.state_dict())}  # fmt: skip
    return out


@pytest.fixture(scope="module")
def every_precision() -> list[dict]:
    return run_ranks(_body, world_size=2, timeout=240)  # one process group for every precision


@pytest.mark.parametrize("precision", list(TOLERANCE))
def test_quantized_output_dists(precision: str, every_precision: list[dict]) -> None:
    for res in every_precision:
        full, low = res["fp32"], res[precision]
        err = ((low["values"] - full["values"]).abs().max() / full["values"].abs().max()).item()
        assert 0 < err < TOLERANCE[precision], err  # encoded (not exact), but close
        for name, table in full["tables"].items():
            change = (low["tables"][name] - table).abs().max() / (table - _ebc().state_dict()[name]).abs().max()
            assert change < TOLERANCE[precision] * 5, (name, float(change))
        if precision in ("fp16", "bf16"):
            assert low["forward_bytes"] * 2 == full["forward_bytes"] > 0
            assert low["bytes"] * 2 == full["bytes"]  # forward and backward: exactly half
        else:
            assert low["bytes"] < full["bytes"] * 0.45


def test_codecs_round_trip_and_config_errors() -> None:
    x = torch.randn(6, 32) * torch.logspace(-3, 3, 6).unsqueeze(1)  # rows of very different scales
    for precision, tolerance in TOLERANCE.items():
        codec = RowCodec(precision)
        wire = codec.encode(x)
        assert wire.dtype == torch.uint8 and wire.shape == (6, codec.wire_width(32))
        relative = (codec.decode(wire, 32) - x).abs().amax(dim=1) / x.abs().amax(dim=1)
        assert (relative < tolerance).all() or precision == "fp16", (precision, relative)
    tiny = torch.full((1, 4), 1e-6)
    assert (RowCodec("fp16", loss_scale=1024.0).decode(RowCodec("fp16", loss_scale=1024.0).encode(tiny), 4) - tiny).abs().max() < 1e-9
    assert get_qcomm_codecs_registry(QCommsConfig()) is None
    registry = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16), comm_ops=[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL])
    assert list(registry) == ["pooled_embeddings_all_to_all"]
    assert registry["pooled_embeddings_all_to_all"].backward.precision == "bf16"
    with pytest.raises(ValueError, match="forward_precision='fp12'"):
        QCommsConfig(forward_precision="fp12")


def _sequence_body(rank: int, world_size: int) -> list[torch.Tensor]:
    from lightrec.distributed import EmbeddingCollectionSharder, ShardingEnv
    from lightrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise

    outs = []
    for kind in ("fp32", "bf16"):
        torch.manual_seed(0)
        ec = EmbeddingCollection([EmbeddingConfig(name=f"t{i}", num_embeddings=50, embedding_dim=8, feature_names=[f])
                                  for i, f in enumerate(FEATURES[:2])])  # fmt: skip
        plan = construct_module_sharding_plan(ec, {"t0": table_wise(1), "t1": row_wise()}, world_size=world_size)
        registry = get_qcomm_codecs_registry(QCommsConfig(kind, kind))
        sharded = EmbeddingCollectionSharder(kernel_backend="torch", qcomm_codecs_registry=registry).shard(
            ec, plan, ShardingEnv.from_process_group(None), torch.device("cpu"))  # fmt: skip
        kjt = _kjt(rank)
        kjt = KeyedJaggedTensor(keys=FEATURES[:2], values=kjt["f0"].values().tolist() and torch.cat(
            [kjt["f0"].values(), kjt["f1"].values()]), lengths=torch.cat([kjt["f0"].lengths(), kjt["f1"].lengths()]))  # fmt: skip
        out = sharded(kjt).wait()
        outs.append(torch.cat([out[f].values() for f in FEATURES[:2]]).detach())
    return outs


def test_sequence_all_to_all_is_encoded_too() -> None:
    for full, low in run_ranks(_sequence_body, world_size=2, timeout=240):
        err = ((low - full).abs().max() / full.abs().max()).item()
        assert 0 < err < TOLERANCE["bf16"]
