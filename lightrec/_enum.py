"""``ValueEnum``: the base of lightrec's enums whose ``str()`` is their value.

torchrec's enums print as their value (``str(ShardingType.ROW_WISE) == "row_wise"``,
``str(DataType.FP16) == "FP16"``) so that plans, logs and metric keys read as plain strings. Every
such enum of lightrec derives from this one class instead of writing ``__str__`` again; a string enum
also mixes in ``str`` (``class ShardingType(str, ValueEnum)``), so that its members compare equal
to their values. ``format()`` and f-strings give the value too (``Enum.__format__`` formats
``str(member)``). It imports nothing of lightrec's, so any room may use it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ValueEnum"]


class ValueEnum(Enum):
    """An ``Enum`` whose ``str()`` (and so ``format()``) is the member's value, not ``Class.MEMBER``."""

    def __str__(self) -> str:
        return str(self.value)
