"""Reference recommendation models built on ``lightrec.modules``.

- ``dlrm``: ``DLRM`` (dot interaction), ``DLRM_DCN`` (low-rank DCN-v2 interaction), ``DLRMTrain``.
- ``deepfm``: ``FieldDeepFM`` (was ``DeepFM``, deprecated); torchrec's ``SimpleDeepFMNN`` and its
  arches (``simple_deepfm.py``).
- ``dlrm`` also holds torchrec's ``DLRM_Projection`` and ``DLRMWrapper``.
- ``two_tower``: ``TwoTower`` retrieval model and ``TwoTowerTrainTask`` (in-batch negatives).

Every model takes an ``EmbeddingBagCollection`` that may live on ``meta`` (to be sharded later)
and creates its dense parameters on ``dense_device`` (``device`` for ``TwoTower``).
"""

from lightrec.models import deepfm as _deepfm
from lightrec.models import dlrm as _dlrm
from lightrec.models.deepfm import FieldDeepFM as FieldDeepFM
from lightrec.models.deepfm import SimpleDeepFMNN as SimpleDeepFMNN
from lightrec.models.dlrm import DLRM as DLRM
from lightrec.models.dlrm import DLRM_DCN as DLRM_DCN
from lightrec.models.dlrm import DenseArch as DenseArch
from lightrec.models.dlrm import DLRM_Projection as DLRM_Projection
from lightrec.models.dlrm import DLRMTrain as DLRMTrain
from lightrec.models.dlrm import DLRMWrapper as DLRMWrapper
from lightrec.models.dlrm import InteractionArch as InteractionArch
from lightrec.models.dlrm import InteractionProjectionArch as InteractionProjectionArch
from lightrec.models.dlrm import OverArch as OverArch
from lightrec.models.dlrm import SparseArch as SparseArch
from lightrec.models.two_tower import TwoTower as TwoTower
from lightrec.models.two_tower import TwoTowerTrainTask as TwoTowerTrainTask

# torchrec's DLRM family (InteractionDCNArch stays at its torchrec path, lightrec.models.dlrm).
__all__ = [name for name in _dlrm.__all__ if name != "InteractionDCNArch"] + [
    "FieldDeepFM",
    "SimpleDeepFMNN",
    "TwoTower",
    "TwoTowerTrainTask",
]


def __getattr__(name: str) -> type[FieldDeepFM]:
    """``DeepFM``: the former name of ``FieldDeepFM`` (deprecated, see ``lightrec.models.deepfm``)."""
    return getattr(_deepfm, name)
