"""Damaged artifacts and metadata are typed errors naming the file; bad export paths fail up front."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrec.inference import ArtifactMetaError, CorruptArtifactError, export, load
from tests.inference.helpers import dlrm


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("a") / "m.pt")


@pytest.mark.parametrize("cut", ["half", "empty", "garbage"])
def test_a_cut_short_torchscript_artifact_is_a_typed_error_naming_the_file(
    artifact: Path, tmp_path: Path, cut: str
) -> None:
    data = artifact.read_bytes()
    damaged = tmp_path / "m.pt"
    damaged.write_bytes({"half": data[: len(data) // 2], "empty": b"", "garbage": b"x" * 100}[cut])
    Path(f"{damaged}.meta.json").write_text(Path(f"{artifact}.meta.json").read_text())
    with pytest.raises(CorruptArtifactError, match=f"'{damaged}' is not a whole TorchScript artifact.*export the model again"):
        load(damaged)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dense_in_features", "5", "field 'dense_in_features' is 5, not a width"),
        ("dense_in_features", -1, "field 'dense_in_features' is -1, not a width"),
        ("is_weighted", "yes", "field 'is_weighted' is yes, not true or false"),
        ("takes_dense", 1, "field 'takes_dense' is 1, not true or false"),
        ("feature_names", ["f0"], "field 'feature_names' is \\['f0'\\], not the features of 'tables'"),
        ("tables", [{"feature_names": ["zz"], "num_embeddings": 3}], "field 'feature_names' is .*not the features"),
        ("tables", [{"feature_names": ["f0", "f1", "f2", "f3"], "num_embeddings": 0}], "field 'tables\\[0\\].num_embeddings' is 0"),
        ("tables", [{"feature_names": ["f0", "f1", "f2", "f3"], "num_embeddings": 9, "id_space": "big"}],
         "field 'tables\\[0\\].id_space' is big"),
        ("tables", [{"feature_names": [["f0"]], "num_embeddings": 9}], "field 'tables\\[0\\].feature_names' is"),
    ],
)
def test_edited_metadata_fields_are_refused_at_load(
    artifact: Path, tmp_path: Path, field: str, value: object, message: str
) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(artifact.read_bytes())
    meta = json.loads(Path(f"{artifact}.meta.json").read_text())
    meta[field] = value
    meta_path = Path(f"{path}.meta.json")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ArtifactMetaError, match=f"'{meta_path}': {message}"):
        load(path)


def test_export_to_a_folder_or_under_a_file_names_the_culprit_before_tracing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    export_module = importlib.import_module("lightrec.inference.export")

    def no_trace(*args: object) -> None:
        raise AssertionError("traced before the path was checked")

    monkeypatch.setattr(export_module, "describe_model", no_trace)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match=f"'{tmp_path / 'afile'}' is a file, not a folder"):
        export(dlrm(), tmp_path / "afile" / "sub" / "m.pt")
    with pytest.raises(IsADirectoryError, match=f"'{tmp_path}' is a folder; give the artifact's file name"):
        export(dlrm(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_shown_names_an_int_too_long_to_print() -> None:
    """A computed int past Python's printable digits (a sum of client numbers) is named, not a ValueError."""
    from lightrec.inference.predictor import shown

    assert shown(10**5000) == f"(an int of {(10**5000).bit_length()} bits)"
    assert str(shown(10**4000)).endswith("... (4001 characters)")  # printable: truncated as before
