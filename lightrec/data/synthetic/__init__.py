"""Synthetic data: planted Criteo-like clicks (host or device, fixed or drifting ids), a planted
MovieLens-shaped set, and torchrec's random batches.

======================  ===========================================================================
module                  what it holds
======================  ===========================================================================
``planted.py``          ``PlantedCriteoModel``: the hidden logistic model, its Bayes-optimal AUC
``criteo.py``           ``SyntheticCriteoDataset``: whole batches of it, deterministic per index
``device.py``           ``TorchPlantedSampler``: the same model drawn with torch on any device
``drifting.py``         ``DriftingVocabulary``: raw 63-bit ids born and retired over time
``stream.py``           ``SyntheticStreamLoader``: the batches in time order, unbounded, resumable
``stream_datamodule``   ``SyntheticStream``: the LightningDataModule over it (imports Lightning)
``movielens.py``        ``synthetic_movielens``: a MovieLens-shaped set with a planted preference
``random_batches.py``   torchrec's ``RandomRecDataset``: random ids, no signal
======================  ===========================================================================

The hashes, power-law draws and exact AUC they share are :mod:`lightrec.data.hashing`; the
Lightning DataModules over them are :class:`lightrec.data.SyntheticCriteo` and
:class:`lightrec.data.MovieLensDataModule`.
"""

from lightrec.data.synthetic.criteo import SyntheticCriteoDataset
from lightrec.data.synthetic.device import TorchPlantedSampler
from lightrec.data.synthetic.drifting import DriftingVocabulary
from lightrec.data.synthetic.movielens import synthetic_movielens
from lightrec.data.synthetic.planted import PlantedCriteoModel
from lightrec.data.synthetic.random_batches import RandomRecDataset
from lightrec.data.synthetic.stream import SyntheticStreamLoader

__all__ = [
    "DriftingVocabulary",
    "PlantedCriteoModel",
    "RandomRecDataset",
    "SyntheticCriteoDataset",
    "SyntheticStreamLoader",
    "TorchPlantedSampler",
    "synthetic_movielens",
]
