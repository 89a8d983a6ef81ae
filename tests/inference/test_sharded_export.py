"""Serving copies of a DistributedModelParallel model on 2 gloo ranks equal the unsharded model's.

Every rank builds the same unsharded model (same seed); the DMP copy keeps those weights (lightrec
does not re-initialise materialised tables), so gathering must give back exactly the unsharded
tables, and quantizing them exactly the unsharded quantized model.
"""

from __future__ import annotations

from pathlib import Path

from tests.multiprocess import run_ranks


def _dmp(model, path: str, per_table: dict):  # noqa: ANN001, ANN202
    import copy

    import torch

    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.distributed.types import ShardingPlan

    collection = model.get_submodule(path)
    plan = ShardingPlan({path: construct_module_sharding_plan(collection, per_table, world_size=2, local_size=2,
                                                              device_type="cpu")})
    return DistributedModelParallel(copy.deepcopy(model), device=torch.device("cpu"), plan=plan)


def _body(rank: int, world_size: int, tmp: str) -> dict:
    import pytest
    import torch

    from lightrec.distributed.planner import column_wise, data_parallel, row_wise, table_wise
    from lightrec.inference import (
        QuantEmbeddingBagCollection,
        export,
        has_sharded_collections,
        load,
        quantize,
    )
    from tests.inference.helpers import dlrm, kjt, sequence_model

    tmp_path = Path(tmp)
    batch, dense = kjt(batch=9, seed=11, max_len=5), torch.randn(9, 5, generator=torch.Generator().manual_seed(1))

    # DLRM: t0 row-wise over both ranks, t1 on rank 1, t2 on rank 0
    reference = dlrm(seed=5)
    dmp = _dmp(reference, "sparse_arch.embedding_bag_collection",
               {"t0": row_wise(), "t1": table_wise(rank=1), "t2": table_wise(rank=0)})
    assert has_sharded_collections(dmp) and has_sharded_collections(dmp.module)
    with pytest.raises(ValueError, match=r"dst must be None \(every rank\) or a rank in \[0, 2\), got 2"):
        quantize(dmp, "int8", dst=2)  # raised before any collective, on every rank
    q0 = quantize(dmp, "int8", dst=0)  # collective; the serving copy lands on rank 0 only
    if rank == 0:
        assert isinstance(q0.sparse_arch.embedding_bag_collection, QuantEmbeddingBagCollection)
        path = export(q0, tmp_path / "dlrm_int8.pt")
        want = quantize(reference, "int8")(dense, batch)
        got = load(path)(dense, batch.values(), batch.lengths())
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        assert q0 is None
    # every rank receives a copy with dst=None; per-table types apply to gathered tables too
    q_all = quantize(dmp, "int4", per_table={"t1": "fp16"})
    assert torch.equal(q_all(dense, batch), quantize(reference, "int4", per_table={"t1": "fp16"})(dense, batch))
    # export(dmp) itself: float tables gathered to rank 0, which writes; every rank returns the path
    float_path = export(dmp, tmp_path / "dlrm_fp32.pt")
    assert float_path.exists()  # rank 1 returns only after rank 0 wrote it
    with torch.no_grad():  # serving numbers: the artifact runs without autograd
        want_float = reference(dense, batch)
    assert torch.equal(load(float_path)(dense, batch.values(), batch.lengths()), want_float)

    # sequence model: EmbeddingCollection with row-wise, column-wise and data-parallel tables
    seq = sequence_model(seed=6)
    seq_dmp = _dmp(seq, "ec", {"t0": row_wise(), "t1": column_wise(ranks=[1, 0]), "t2": data_parallel()})
    q_seq = quantize(seq_dmp, "int8", dst=1)
    if rank == 1:
        assert torch.equal(q_seq(batch), quantize(seq, "int8")(batch))
    else:
        assert q_seq is None
    return {"rank": rank}


def test_dmp_quantize_and_export_match_unsharded(tmp_path: Path) -> None:
    results = run_ranks(_body, 2, args=(str(tmp_path),), timeout=180)
    assert [r["rank"] for r in results] == [0, 1]
    assert (tmp_path / "dlrm_int8.pt.meta.json").exists() and (tmp_path / "dlrm_fp32.pt.meta.json").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # atomic writes leave no temporaries



def _clamped_body(rank: int, world_size: int, tmp: str) -> dict:
    """A collection trained with bounds_check "clamp" (or "skip") keeps it through the sharded serving copies."""
    import torch

    import lightrec
    from lightrec.distributed.planner import row_wise, table_wise
    from lightrec.inference import export, load, quantize
    from lightrec.models import DLRM
    from tests.inference.helpers import SequenceScorer, sequence_tables, tables

    torch.manual_seed(5)
    ebc = lightrec.EmbeddingBagCollection(tables(mean_last=False), bounds_check="clamp")
    reference = DLRM(ebc, dense_in_features=5, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval()
    dmp = _dmp(reference, "sparse_arch.embedding_bag_collection",
               {"t0": row_wise(), "t1": table_wise(rank=1), "t2": table_wise(rank=0)})
    past = lightrec.KeyedJaggedTensor(keys=["f0", "f1", "f2", "f3"], values=torch.tensor([45, 1, 2, 3, 99]),
                                      lengths=torch.tensor([1, 1, 1, 2]))  # 45 and 99 are past their tables
    dense = torch.zeros(1, 5)
    q = quantize(dmp, "int8")  # every rank: before, the copy's collection raised EmbeddingIdError on id 45
    assert q.sparse_arch.embedding_bag_collection._bounds_check == "clamp"
    assert torch.equal(q(dense, past), quantize(reference, "int8")(dense, past))
    path = export(dmp, Path(tmp) / "clamped_fp32.pt")  # the float tables gathered into an unsharded collection
    if rank == 0:
        with torch.no_grad():
            assert torch.equal(load(path)(dense, past.values(), past.lengths()), reference(dense, past))

    torch.manual_seed(6)
    seq = SequenceScorer(lightrec.EmbeddingCollection(sequence_tables(), bounds_check="skip")).eval()
    q_seq = quantize(_dmp(seq, "ec", {"t0": row_wise(), "t1": table_wise(rank=1), "t2": table_wise(rank=0)}), "int8")
    assert torch.equal(q_seq(past), quantize(seq, "int8")(past))
    return {"rank": rank}


def test_dmp_serving_copies_keep_the_collections_bounds_check(tmp_path: Path) -> None:
    results = run_ranks(_clamped_body, 2, args=(str(tmp_path),), timeout=180)
    assert [r["rank"] for r in results] == [0, 1]
