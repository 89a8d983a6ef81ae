"""Review: the Criteo TSV parsers refuse values Python's int()/float() would accept but the
documented format does not (``0x1f``, ``1_f``, `` 3``), and name a BOM or a header line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightrec.data import DataFormatError, preprocess_criteo
from lightrec.data.criteo.parse import parse_criteo_lines, parse_criteo_lines_one_by_one, parse_fast
from lightrec.data.errors import LineErrors


def _line(label: str = "1", dense: list[str] | None = None, cats: list[str] | None = None) -> bytes:
    dense = dense if dense is not None else [str(k) for k in range(13)]
    cats = cats if cats is not None else [format(k * 7919, "08x") for k in range(26)]
    return ("\t".join([label, *dense, *cats]) + "\n").encode()


def _with_dense(k: int, value: str) -> bytes:
    dense = [str(j) for j in range(13)]
    dense[k] = value
    return _line(dense=dense)


def _with_cat(k: int, value: str) -> bytes:
    cats = [format(j * 7919, "08x") for j in range(26)]
    cats[k] = value
    return _line(cats=cats)


BAD_VALUES = [
    (_with_cat(3, "0x1f"), "categorical value b'0x1f' in cat_3 is not hex"),
    (_with_cat(5, "1_f"), "categorical value b'1_f' in cat_5 is not hex"),
    (_with_cat(0, " 1f"), "categorical value b' 1f' in cat_0 is not hex"),
    (_with_cat(7, "1f "), "categorical value b'1f ' in cat_7 is not hex"),
    (_with_dense(2, " 3"), "non-numeric dense value b' 3' in int_2"),
    (_with_dense(4, "1_000"), "non-numeric dense value b'1_000' in int_4"),
    (_with_dense(12, "3 "), "non-numeric dense value b'3 ' in int_12"),
    (_with_dense(0, "0x10"), "non-numeric dense value b'0x10' in int_0"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_VALUES)
def test_lenient_int_forms_are_refused_by_both_parsers(bad: bytes, reason: str) -> None:
    good = _line()
    lines = [good, good, bad, good]
    assert parse_fast(lines) is None  # the vectorised parser refuses the block ...
    with pytest.raises(DataFormatError, match=reason) as info:  # ... and the line parser names it
        parse_criteo_lines(lines, "day_0", 1, LineErrors("raise"))
    assert info.value.line == 3 and info.value.path == "day_0"
    errors = LineErrors("skip")
    labels, dense, cats = parse_criteo_lines(lines, "day_0", 1, errors)
    assert errors.skipped == 1 and labels.shape == (3,)
    want = parse_fast([good, good, good])
    assert want is not None
    for got, ref in zip((labels, dense, cats), want, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_documented_forms_still_parse_and_parsers_agree() -> None:
    dense = ["-3", "", "0", "123456789012345", "7", "-1", "", "2", "9", "10", "11", "12", "0"]
    cats = ["", "00ABcdEF", "ffffffff", "0", "1", *[format(k, "x") for k in range(21)]]
    lines = [_line(dense=dense, cats=cats), _line("0")]
    fast = parse_fast(lines)
    assert fast is not None
    slow = parse_criteo_lines_one_by_one(lines, "x", 1, LineErrors("raise"))
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)
    assert slow[1][0].tolist()[:4] == [-3.0, 0.0, 0.0, float(np.float32(123456789012345))]
    assert slow[2][0].tolist()[:3] == [-1, 0xABCDEF, 0xFFFFFFFF]
    # decimal fractions stay accepted by the line parser (documented)
    frac = parse_criteo_lines_one_by_one([_with_dense(1, "1.5"), _with_dense(1, "-.5")], "x", 1, LineErrors("raise"))
    assert frac[1][:, 1].tolist() == [1.5, -0.5]


def test_bom_is_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_bytes(b"\xef\xbb\xbf" + _line() + _line("0"))
    with pytest.raises(DataFormatError, match=r"train.txt:1: .*UTF-8 byte order mark \(BOM.*save the file without") as info:
        preprocess_criteo(path, tmp_path / "o", num_embeddings_cap=100, progress=False)
    assert "label must be 0 or 1" not in str(info.value) and info.value.line == 1


@pytest.mark.parametrize(
    "header",
    [
        "\t".join(["label", *[f"I{k}" for k in range(1, 14)], *[f"C{k}" for k in range(1, 27)]]) + "\n",
        "label\tint_0\tcat_0\n",
    ],
)
def test_header_line_is_named_with_the_fix(tmp_path: Path, header: str) -> None:
    path = tmp_path / "day_0"
    path.write_bytes(header.encode() + _line() + _line("0"))
    with pytest.raises(DataFormatError, match=r"day_0:1: .*header.*'label'.*remove") as info:
        preprocess_criteo(path, tmp_path / "o", num_embeddings_cap=100, progress=False)
    assert "label must be 0 or 1" not in str(info.value)
    meta = preprocess_criteo(path, tmp_path / "o2", num_embeddings_cap=100, on_error="skip", progress=False)
    assert meta["rows"] == 2 and meta["skipped_lines"] == 1


def test_bad_label_later_in_the_file_keeps_its_message() -> None:
    lines = [_line(), _line("label"), _line("2")]
    with pytest.raises(DataFormatError, match=r"x:2: label must be 0 or 1, got b'label'"):
        parse_criteo_lines(lines, "x", 1, LineErrors("raise"))
