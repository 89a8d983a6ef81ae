"""lightrec: Lightning-based framework for large-scale recommendation models.

The flat namespace mirrors torchrec's, so ``import lightrec as torchrec``-style code works:
``lightrec.KeyedJaggedTensor``, ``lightrec.EmbeddingBagCollection``, ``lightrec.EmbeddingBagConfig``...
"""

from lightrec import _source_tree
from lightrec._version import __version__
from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.modules import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from lightrec.optim import (
    CombinedOptimizer,
    EmbOptimType,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
    in_backward_optimizer_filter,
)
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

_source_tree.install()  # lightrec.recipes is the top-level recipes/ folder (see _source_tree)

# Names that pull in Lightning (or the data stack) load on first use, so `import lightrec`
# stays light for inference processes and users of the distributed layer alone.
_LAZY = {
    "RecModule": "lightrec.lightning",
    "RecStrategy": "lightrec.lightning",
    "Batch": "lightrec.data",
}


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 module attribute hook
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in ("data", "distributed", "inference", "kernels", "lightning", "metrics", "models", "optim", "quant", "fx"):
        import importlib

        return importlib.import_module(f"lightrec.{name}")
    raise AttributeError(f"module 'lightrec' has no attribute {name!r}")

__all__ = [
    "Batch",
    "CombinedOptimizer",
    "EmbOptimType",
    "FusedEmbeddingBagCollection",
    "FusedEmbeddingCollection",
    "KeyedOptimizer",
    "KeyedOptimizerWrapper",
    "RowWiseAdagrad",
    "apply_optimizer_in_backward",
    "in_backward_optimizer_filter",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PoolingType",
    "RecModule",
    "RecStrategy",
    "__version__",
]
