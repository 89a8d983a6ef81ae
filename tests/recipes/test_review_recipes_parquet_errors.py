"""Mistakes in the documented ``lightrec run dlrm --data parquet --data.path ... --data.label ...`` command:
one line naming the option, exit 2, nothing run.

Before: a bad *value* of a ParquetDataModule option (``--data.id_mapping managd``, ``--data.follow ture``)
said the option did not exist (``--data.id_mapping is not an option (did you mean
'--data.ids_distribution'?)``: the "did you mean" keys were the config's SyntheticCriteo's, not the
class ``--data parquet`` picked), and a missing column or folder came wrapped in jsonargparse's
``Call to compute_fn of link 'dense_width_of(data) --> ...' with args ({Train dataloader: None}; ...) failed:``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrec.cli import main


def _write_logs(folder: Path, third: str) -> Path:
    """256 rows of ``user_id``, ``item_id``, ``third`` (``price`` floats or ``item_genre`` ids) and ``click``
    in one Parquet file of ``folder``; every click 1 for retrieval pairs (``item_genre``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 256
    columns = {"user_id": rng.integers(0, 50, n), "item_id": rng.integers(0, 30, n)}
    pairs = third == "item_genre"
    columns[third] = rng.integers(0, 19, n) if pairs else rng.random(n)
    columns["click"] = np.ones(n, np.int64) if pairs else (rng.random(n) < 0.3).astype(np.int64)
    pq.write_table(pa.table(columns), folder / "part-000.parquet")
    return folder


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_logs(tmp_path_factory.mktemp("logs"), "price")


# (options after `lightrec run dlrm --data parquet --data.path LOGS --data.label click`, the error line)
MISTAKES = [
    (["--data.id_mapping", "managd"],
     "error: --data.id_mapping: Expected a typing.Literal['none', 'modulo', 'hash', 'managed']. Got value: managd"),
    (["--data.follow", "ture"], "error: --data.follow: Expected a <class 'bool'>. Got value: ture"),
    (["--data.init_args.follw", "true"],
     "error: --data.init_args.follw is not an option (did you mean '--data.init_args.follow'?)"),
    (["--data.label", "clik"], "column 'clik': the label reads column 'clik', which the file does not have"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "expected"), MISTAKES, ids=[" ".join(e) for e, _ in MISTAKES])
def test_a_parquet_option_mistake_is_one_line_naming_the_option(
    extra: list[str],
    expected: str,
    logs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", "dlrm", "--data", "parquet", "--data.path", str(logs), "--data.label", "click", "--devices", "1"]
    assert main([*args, *extra]) == 2
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "is not an option" not in lines[0] or "follw" in lines[0]
    assert "compute_fn" not in lines[0] and "Train dataloader" not in lines[0]
    assert not list(tmp_path.iterdir())  # nothing ran


def test_the_data_class_of_the_command_line_gives_the_known_keys() -> None:
    from lightrec.lightning.recipe.checks import _data_class_path

    assert _data_class_path(["--data", "lightrec.data.ParquetDataModule", "--data.path", "x"]) == (
        "lightrec.data.ParquetDataModule"
    )
    assert _data_class_path(["--data=lightrec.data.X", "--data.class_path", "lightrec.data.Y"]) == "lightrec.data.Y"
    assert _data_class_path(["--data.init_args.batch_size", "8"]) is None


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_logs(tmp_path_factory.mktemp("pairs"), "item_genre")


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [("[item_id, item_genr]", "names features ['item_genr'] the data does not have"),
     ("[user_id, item_id, item_genre]", "leaves the query tower no feature")],
)  # fmt: skip
def test_two_tower_candidate_features_are_checked_against_the_parquet_columns(
    candidates: str,
    expected: str,
    pairs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """docs/data.md's two_tower command with a typo in --model.candidate_feature_names was a traceback from
    every rank's configure_model (exit 1), after the ranks started."""
    monkeypatch.chdir(tmp_path)
    args = ["run", "two_tower", "--data", "parquet", "--data.path", str(pairs), "--data.label", "click",
            "--data.dense", "[]", "--model.candidate_feature_names", candidates, "--devices", "1"]  # fmt: skip
    assert main(args) == 2
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: --model.candidate_feature_names") and expected in lines[0], lines[0]
    assert "the data's sparse features are ['user_id', 'item_id', 'item_genre']" in lines[0]


def test_two_tower_accepts_candidate_features_of_the_parquet_columns(pairs: Path) -> None:
    from lightrec.data import ParquetDataModule
    from lightrec.recipes.two_tower import TwoTowerModule

    data = ParquetDataModule(str(pairs), label="click", dense=[], task="retrieval")
    TwoTowerModule(candidate_feature_names=["item_id", "item_genre"]).check_datamodule(data)
