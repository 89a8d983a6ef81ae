"""MovieLens ratings: lightrec's reader and batches, and torchrec's row readers.

======================  ===========================================================================
module                  what it holds
======================  ===========================================================================
``reader.py``           ``read_movielens``: ml-100k / ml-1m / ml-20m / ml-25m -> ``MovieLensData``
                        (ids renumbered from 1, genres per movie, user side features)
``dataset.py``          ``MovieLensDataset``: whole batches of interactions for CTR or retrieval
``torchrec_rows.py``    torchrec's ``movielens_20m`` / ``movielens_25m`` rows and column names
======================  ===========================================================================

``lightrec.datasets.movielens`` (torchrec's path) re-exports ``torchrec_rows.py``; the planted
synthetic set is :func:`lightrec.data.synthetic.synthetic_movielens` and the Lightning DataModule
over both is :class:`lightrec.data.MovieLensDataModule`.
"""

from lightrec.data.movielens.dataset import MovieLensDataset
from lightrec.data.movielens.reader import MovieLensData, read_movielens

__all__ = ["MovieLensData", "MovieLensDataset", "read_movielens"]
