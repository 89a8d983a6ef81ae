"""``validate_keyed_jagged_tensor``: torchrec's check of a KJT before it is fed to a model
(``torchrec.sparse.jagged_tensor_validator``).

Two parts, as in torchrec:

* the layout (lengths and offsets agree with the values, unique keys, one length per key and sample,
  one weight per value): :meth:`KeyedJaggedTensor.validate`, which raises
  :class:`~lightrec.sparse.jagged.SparseValueError` (a ``ValueError``) naming the first problem;
* with table configs, the *range* of the ids: a feature whose ids fall outside ``[0,
  num_embeddings)`` of its table is logged as a warning and makes the result ``False`` (a soft
  check; the collections' own id checks are the hard one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor

__all__ = ["TableRange", "validate_keyed_jagged_tensor"]

logger = logging.getLogger(__name__)


class TableRange(Protocol):
    """What the range check reads of a table config (``EmbeddingBagConfig`` / ``EmbeddingConfig``)."""

    num_embeddings: int
    feature_names: list[str]


def validate_keyed_jagged_tensor(kjt: KeyedJaggedTensor, configs: Sequence[TableRange] | None = None) -> bool:
    """Check a KJT's layout and, with ``configs``, the range of its ids.

    Args:
        kjt: the batch.
        configs: table configs; each feature is checked against the ``num_embeddings`` of the
            table that lists it (features no table lists are skipped).

    Returns:
        ``True`` when every id is in range (or no configs are given); ``False`` when some feature
        has ids outside its table (each such feature is logged as a warning).

    Raises:
        ValueError: the layout is inconsistent (the message names the first problem).
    """
    kjt.validate()
    if configs is None:
        return True
    rows = {feature: config.num_embeddings for config in configs for feature in config.feature_names}
    valid = True
    for key, jt in kjt.to_dict().items() if kjt.keys() else ():
        ids = jt.values()
        if key not in rows or ids.numel() == 0:
            continue
        low, high = (int(v) for v in ids.aminmax())
        if low < 0 or high >= rows[key]:
            logger.warning(
                "feature %r has ids in [%d, %d], outside [0, %d) of its table", key, low, high, rows[key]
            )
            valid = False
    return valid
