"""Ranks whose listings of the data differ take rank 0's files (``lightrec.data.parquet.ranks``), on real gloo ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.data.parquet._listing_ranks import LARGE, listings_that_differ, the_edges_of_agreeing
from tests.multiprocess import run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, object]]]:
    """Every case of ``listings_that_differ`` on two spawned gloo ranks, once for the tests below."""
    return run_ranks(listings_that_differ, 2, args=(str(tmp_path_factory.mktemp("listings")),), timeout=60)


@pytest.mark.slow  # ~10 s: two spawned ranks importing torch, lightrec and Lightning (the DataModule)
def test_ranks_that_listed_different_files_train_on_rank_0s_and_size_tables_alike(ranks: list) -> None:
    """A file that lands while the ranks start is in some ranks' listings only. Without the agreement the
    ranks sized the tables differently (50 against 1050 rows) and planned different steps (a hang). Now
    every rank takes rank 0's files at ``setup``: the same table sizes, the same steps, every row of rank 0's
    files read once -- followed folders and fixed ones alike."""
    for mode in ("fixed", "follow"):
        # rank 0 listed after the late file: every rank reads both files, tables sized for the large ids
        # (in a fixed folder only: a followed one's late file has small ids, see the rank body)
        both, first_only = ranks[0][f"{mode}-late-0"], ranks[0][f"{mode}-late-1"]
        assert both["files"] == ["part-00.parquet", "part-01.parquet"]
        assert (both["sizes"][0] >= LARGE) == (mode == "fixed")
        # rank 0 listed before it: rank 1 leaves its own listing's late file out (a following loader reads
        # it in the poll that finds it, so only the fixed folder leaves it out for good)
        assert first_only["files"] == ["part-00.parquet"] and first_only["sizes"][0] < LARGE
        for late in (0, 1):
            case = f"{mode}-late-{late}"
            mine, other = ranks[0][case], ranks[1][case]
            assert mine["sizes"] == other["sizes"] and mine["files"] == other["files"], case
            assert len(mine["rows"]) == len(other["rows"]), case  # the same steps on every rank
            read = sorted(mine["rows"] + other["rows"])
            assert len(read) == len(set(read)), case  # no row twice
        assert len(ranks[0]["fixed-late-0"]["rows"]) * 2 == 70 and len(ranks[0]["fixed-late-1"]["rows"]) * 2 == 40
        assert len(ranks[0]["follow-late-0"]["rows"]) * 2 == 70 and len(ranks[0]["follow-late-1"]["rows"]) * 2 == 70


@pytest.mark.slow  # shares the spawned ranks with the test above
def test_tables_sized_before_the_ranks_agreed_are_an_error_on_every_rank(ranks: list) -> None:
    """A rank that sized its tables from its own listing (a model built before ``trainer.fit``) and then
    learns that rank 0's files size them otherwise stops, and so does every other rank, naming the table,
    both sizes and the fix; where rank 0's files size them the same, nothing is raised."""
    # the late file's ids are small: the listings differ, the sizes do not, and the ranks go on with rank 0's files
    assert [rank["sized-early-late-1-small-ids"] for rank in ranks] == [{"error": None, "type": None}] * 2
    for late in (0, 1):
        errors = [rank[f"sized-early-late-{late}"] for rank in ranks]
        assert [e["type"] for e in errors] == ["RankDataMismatchError"] * 2, late
        # rank 1 sized from its own listing and learnt rank 0's: its error names the table, both sizes, the fix
        own = errors[1]["error"]
        sizes = re.search(r"scalar (\d+) -> (\d+) rows", own)
        assert sizes is not None, own
        before, after = int(sizes[1]), int(sizes[2])  # largest id + 1 over each listing: <= 50 or >= LARGE
        assert (before <= 50 < LARGE <= after) if late == 0 else (after <= 50 < LARGE <= before), own
        assert "num_embeddings" in own and "before trainer.fit" in own
        assert errors[0]["error"] == f"rank 1 failed while taking the files rank 0 listed: RankDataMismatchError: {own} (every rank stops with it)"


@pytest.mark.slow  # ~10 s: two spawned ranks importing torch, lightrec and Lightning (the DataModule)
def test_the_edges_of_agreeing_on_rank_0s_files(tmp_path: Path) -> None:
    """A DataModule of a one-process trainer beside a larger world reads alone (it waited in a collective for a
    rank that never joined); a ``setup`` before torch.distributed runs does not count as agreed (the ranks then
    trained on different files); a refused agreement changes nothing, so a second ``setup`` refuses again; a
    file replaced in place between two ranks' listings stops both ranks, naming it, while each node's own copy of
    the same files (other modification times) is the same data; the ``val`` loaders select among the agreed
    files (a file landing later in the ``val`` folder failed one rank's loaders)."""
    ranks = run_ranks(the_edges_of_agreeing, 2, args=(str(tmp_path),), timeout=60)
    assert ranks[0]["alone"] == 8  # 40 rows, batches of 5, one rank
    assert ranks[0]["before-group"] == ranks[1]["before-group"]
    assert ranks[0]["before-group"]["files"] == ["part-00.parquet"]  # rank 1 listed the late file too: rank 0's list
    for rank in ranks:
        assert [r["type"] for r in rank["retry"]] == ["RankDataMismatchError"] * 2
    own, peer = ranks[1]["replaced"], ranks[0]["replaced"]
    assert own["type"] == "ParquetFileChangedError" and "replaced or written in place while the ranks started" in own["error"]
    assert peer["type"] == "RankDataMismatchError" and "rank 1 failed while taking the files rank 0 listed" in peer["error"]
    assert ranks[0]["val-later"] == ranks[1]["val-later"] == [4, 1]  # 40 train rows / (2 x 5); 10 val rows / 10
    # each node's own copy of the files, with its own modification times, is the same data (no refusal)
    assert ranks[0]["node-copies"] == ranks[1]["node-copies"] == {"type": None, "error": None}
