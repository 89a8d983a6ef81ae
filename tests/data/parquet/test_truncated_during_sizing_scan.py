"""A file cut short while sizing scans a row group without statistics is a typed error naming the file, not a process
killed by SIGBUS (found in review: the scan read the column's pages through a memory map of the file, which the
reader avoids for exactly this reason). Run in a child process: on the old code the child dies."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lightrec.data.parquet import ParquetDataError, ParquetSource, build_spec, size_tables

    path = sys.argv[1]
    rows = 200_000
    table = pa.table({"label": pa.array(np.arange(rows) % 2, pa.int8()), "user": pa.array(np.arange(rows))})
    pq.write_table(table, path, write_statistics=False)  # no statistics: sizing scans the column
    source = ParquetSource(path)
    spec = build_spec(source.schema, path, "label", [], ["user"])
    read_row_group = pq.ParquetFile.read_row_group

    def cut_then_read(self, *args, **kwargs):
        os.truncate(path, 0)  # a writer replacing the file in place, between the open and the read
        return read_row_group(self, *args, **kwargs)

    pq.ParquetFile.read_row_group = cut_then_read
    try:
        size_tables(source, spec)
    except ParquetDataError as exc:
        print(f"{type(exc).__name__}: {exc}")
        sys.exit(3)
    print("no error")
    """
)


def test_a_file_truncated_during_the_sizing_scan_is_a_typed_error_not_sigbus(tmp_path: Path) -> None:
    path = tmp_path / "part-00.parquet"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    # before: the child was killed by SIGBUS (returncode -7) while decoding the mapped pages
    assert done.returncode != -signal.SIGBUS, "the sizing scan read a truncated file through a memory map (SIGBUS)"
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ParquetFileChangedError" in done.stdout and "part-00.parquet" in done.stdout, done.stdout
