"""``export(..., format="export")`` writes its temporary archive under a name that ends in ``.pt2``:
``torch.export.save`` logs "Expect archive file to be a file ending in .pt2" for any other name, a
warning every user saw on every ``.pt2`` export although nothing was wrong. No temporary is left."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightrec.inference import export
from tests.inference.helpers import dlrm


def test_a_pt2_export_logs_no_archive_name_warning(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        export(dlrm(), tmp_path / "m.pt2", format="export")
    logged = caplog.text + capfd.readouterr().err  # torch's logger may write to stderr itself
    assert "ending in .pt2" not in logged, logged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2", "m.pt2.meta.json"]
