"""Criteo click logs: the schema, the TSV parsers, lightrec's preprocessing into memory-mapped
chunks and the dataset over them, and torchrec's readers (TSV rows, binary ``.npy`` files).

=========================  =====================================================================
module                     what it holds
=========================  =====================================================================
``spec.py``                feature names, cardinality presets, ``table_configs``, torchrec's
                           Criteo constants (``DAYS``, ``DEFAULT_COLUMN_NAMES`` ...)
``parse.py``               raw TSV lines -> labels, dense counts, raw categoricals: the
                           vectorised parser and the line parser that names bad lines
``preprocess.py``          ``preprocess_criteo``: TSV files -> resumable memory-mapped chunks
``memmap_dataset.py``      ``CriteoMemmapDataset``: whole batches over those chunks
``torchrec_readers.py``    torchrec's ``criteo_kaggle`` / ``criteo_terabyte`` row readers and its
                           binary ``.npy`` format (``BinaryCriteoUtils``,
                           ``InMemoryBinaryCriteoIterDataPipe``)
=========================  =====================================================================

The package exports lightrec's pipeline; the constants are imported from ``spec.py`` (or
:mod:`lightrec.data`), torchrec's names from ``lightrec.datasets.criteo`` (torchrec's path, a
re-export of ``spec.py`` and ``torchrec_readers.py``). The Lightning DataModule over the chunks is
:class:`lightrec.data.CriteoDataModule`.
"""

from lightrec.data.criteo.memmap_dataset import CriteoMemmapDataset, load_criteo_meta
from lightrec.data.criteo.parse import parse_criteo_lines
from lightrec.data.criteo.preprocess import preprocess_criteo

__all__ = ["CriteoMemmapDataset", "load_criteo_meta", "parse_criteo_lines", "preprocess_criteo"]
