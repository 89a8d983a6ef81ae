"""The publish folder: versioned snapshots and deltas of a model's rows, written by training, read by serving.

A trainer writes a *snapshot* (every row of every table, and the dense weights) now and then, and
*deltas* (the rows that changed since the version before, the dense weights on their own cadence)
in between, each as one folder ``DIR/v000000042/`` that appears atomically. A server rebuilds any
version from the newest snapshot before it and the deltas after (``docs/deltas.md`` has the format;
files are safetensors + JSON, readable without lightrec).

Files, each on top of the one before: ``errors.py`` (typed errors), ``manifest.py`` (names,
``manifest.json``), ``rows.py`` (rows of a table; fp32 rows into the artifact's row format),
``writer.py`` (:class:`DeltaWriter`: atomic versions, retention), ``reader.py``
(:class:`DeltaReader`: verification, chains), ``publish.py`` (an unsharded model's rows and dense
weights into a writer), ``sharded_publish.py`` (:func:`publish_changes`: a sharded model's changed
rows, gathered from the ranks that hold them), ``background.py`` (:class:`BackgroundPublisher`: the
same, sent and written while training goes on). Applying versions to a serving artifact is
:mod:`lightrec.serving.deltas`.
"""

from lightrec.distributed.deltas.background import BackgroundPublisher, PendingPublish
from lightrec.distributed.deltas.errors import (
    DeltaApplyError,
    DeltaChainError,
    DeltaError,
    DeltaFormatError,
    DeltaNotFoundError,
    DeltaVerificationError,
    DeltaWriteError,
)
from lightrec.distributed.deltas.manifest import (
    FORMAT,
    FORMAT_VERSION,
    ROW_FORMATS,
    FileRecord,
    Manifest,
    TableSpec,
    parse_version_name,
    version_name,
)
from lightrec.distributed.deltas.publish import (
    dense_weights,
    publish_rows,
    publish_snapshot,
    table_rows,
    table_specs,
)
from lightrec.distributed.deltas.reader import DeltaReader, DeltaState, Version, merge_versions
from lightrec.distributed.deltas.rows import TableRows, decode_rows, encode_rows
from lightrec.distributed.deltas.sharded_publish import (
    DeltaPublishError,
    publish_changes,
    sharded_dense_weights,
    sharded_table_specs,
)
from lightrec.distributed.deltas.writer import DeltaWriter

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ROW_FORMATS",
    "BackgroundPublisher",
    "DeltaApplyError",
    "DeltaChainError",
    "DeltaError",
    "DeltaFormatError",
    "DeltaNotFoundError",
    "DeltaPublishError",
    "DeltaReader",
    "DeltaState",
    "DeltaVerificationError",
    "DeltaWriteError",
    "DeltaWriter",
    "FileRecord",
    "Manifest",
    "PendingPublish",
    "TableRows",
    "TableSpec",
    "Version",
    "decode_rows",
    "dense_weights",
    "encode_rows",
    "merge_versions",
    "parse_version_name",
    "publish_changes",
    "publish_rows",
    "publish_snapshot",
    "sharded_dense_weights",
    "sharded_table_specs",
    "table_rows",
    "table_specs",
    "version_name",
]
