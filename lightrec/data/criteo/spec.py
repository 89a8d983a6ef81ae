"""The Criteo schema: feature names, per-feature cardinalities and the matching table configs.

Criteo click logs have 13 integer ("dense") and 26 categorical features. Names follow torchrec's
``DEFAULT_INT_NAMES`` / ``DEFAULT_CAT_NAMES`` so configs move between the two unchanged.

Cardinalities are the number of distinct values of each categorical feature:

- ``"kaggle"``: the Display Advertising Challenge ``train.txt`` (45.8M rows, 7 days), as counted
  by the DLRM reference preprocessing.
- ``"1tb"``: the Criteo 1TB click logs (24 days), the ``num_embeddings_per_feature`` used by
  torchrec's DLRM example (ids there are already capped at 40M per feature).

torchrec's other constants of ``torchrec.datasets.criteo`` (``DAYS``, ``FREQUENCY_THRESHOLD``,
``DEFAULT_LABEL_NAME``, ``DEFAULT_COLUMN_NAMES``: the TSV columns in file order) live here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

__all__ = [
    "CAT_FEATURE_COUNT",
    "CRITEO_1TB_CARDINALITIES",
    "CRITEO_KAGGLE_CARDINALITIES",
    "DAYS",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_INT_NAMES",
    "DEFAULT_LABEL_NAME",
    "FREQUENCY_THRESHOLD",
    "INT_FEATURE_COUNT",
    "TOTAL_TRAINING_SAMPLES",
    "resolve_cardinalities",
    "table_configs",
]

INT_FEATURE_COUNT = 13
CAT_FEATURE_COUNT = 26
DEFAULT_INT_NAMES: list[str] = [f"int_{i}" for i in range(INT_FEATURE_COUNT)]
DEFAULT_CAT_NAMES: list[str] = [f"cat_{i}" for i in range(CAT_FEATURE_COUNT)]
DEFAULT_LABEL_NAME = "label"
DEFAULT_COLUMN_NAMES: list[str] = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
#: Days of the Criteo 1TB click logs (``day_0`` .. ``day_23``).
DAYS = 24
#: Rows of the Criteo 1TB days 0-22, the training days (day 23 is split into validation and test).
TOTAL_TRAINING_SAMPLES = 4_195_197_692
#: torchrec's default frequency threshold of its Criteo preprocessing.
FREQUENCY_THRESHOLD = 3

CRITEO_KAGGLE_CARDINALITIES: list[int] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip

CRITEO_1TB_CARDINALITIES: list[int] = [
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
]  # fmt: skip

_PRESETS = {"kaggle": CRITEO_KAGGLE_CARDINALITIES, "1tb": CRITEO_1TB_CARDINALITIES}


def resolve_cardinalities(
    cardinalities: str | Sequence[int] = "kaggle",
    scale: float = 1.0,
    num_embeddings_cap: int | None = None,
) -> list[int]:
    """Per-feature table sizes: a preset or an explicit list, scaled down and capped.

    Args:
        cardinalities: ``"kaggle"``, ``"1tb"`` or a list of 26 positive ints.
        scale: multiply every cardinality by this (``0 < scale <= 1`` shrinks; rounded up, at least 1).
        num_embeddings_cap: upper bound applied after scaling (``None``: no cap).

    Returns:
        26 positive ints.
    """
    if isinstance(cardinalities, str):
        if cardinalities.lower() not in _PRESETS:
            raise ValueError(
                f"cardinalities must be 'kaggle', '1tb' or a list of {CAT_FEATURE_COUNT} ints, got {cardinalities!r}"
            )
        base = list(_PRESETS[cardinalities.lower()])
    else:
        base = [int(c) for c in cardinalities]
        if len(base) != CAT_FEATURE_COUNT or any(c <= 0 for c in base):
            raise ValueError(
                f"cardinalities must hold {CAT_FEATURE_COUNT} positive ints (one per categorical feature), "
                f"got {len(base)} values {base[:5]}..."
            )
    if not (scale > 0):
        raise ValueError(f"scale must be > 0, got {scale!r}")
    bad_cap = isinstance(num_embeddings_cap, bool) or not isinstance(num_embeddings_cap, (int, np.integer))
    if num_embeddings_cap is not None and (bad_cap or num_embeddings_cap < 1):
        # a float cap made float table sizes, and float arithmetic in the id scrambling
        raise ValueError(f"num_embeddings_cap must be a positive int or None, got {num_embeddings_cap!r}")
    out = [max(1, math.ceil(c * scale)) for c in base]
    if num_embeddings_cap is not None:
        out = [min(c, num_embeddings_cap) for c in out]
    return out


def table_configs(
    embedding_dim: int,
    num_embeddings_per_feature: Sequence[int] | None = None,
    feature_names: Sequence[str] | None = None,
    pooling: PoolingType = PoolingType.SUM,
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per categorical feature: table ``t_<feature>`` over ``[<feature>]``.

    Args:
        embedding_dim: width of every table.
        num_embeddings_per_feature: rows per table; defaults to the Kaggle cardinalities.
        feature_names: defaults to ``DEFAULT_CAT_NAMES`` (``cat_0`` … ``cat_25``).
        pooling: bag pooling of every table.
    """
    names = list(feature_names) if feature_names is not None else list(DEFAULT_CAT_NAMES)
    rows = (
        list(num_embeddings_per_feature)
        if num_embeddings_per_feature is not None
        else CRITEO_KAGGLE_CARDINALITIES
    )
    if len(rows) != len(names):
        raise ValueError(
            f"num_embeddings_per_feature has {len(rows)} entries but there are {len(names)} features {names[:3]}...; "
            "give one table size per feature"
        )
    return [
        EmbeddingBagConfig(
            num_embeddings=int(n),
            embedding_dim=embedding_dim,
            name=f"t_{f}",
            feature_names=[f],
            pooling=pooling,
        )
        for f, n in zip(names, rows, strict=True)
    ]
