"""``EnumerableShardingSpec``: the shards of one table, listed (torchrec's spelling of a sharding spec).

torchrec stores ``ParameterSharding.sharding_spec`` as ``EnumerableShardingSpec(shards=[...])``
and reads ``spec.shards``; lightrec's plans iterate the spec as a list of ``ShardMetadata``.
This class is both: a ``list`` of shards whose ``shards`` attribute is the list itself, so plan
code written either way works, and a plan's JSON form does not change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["EnumerableShardingSpec"]


class EnumerableShardingSpec(list[Any]):
    """A list of ``ShardMetadata`` (one per shard, in shard order) that also answers ``.shards``.

    Args:
        shards: the table's shards.
    """

    def __init__(self, shards: Iterable[Any] = ()) -> None:
        super().__init__(shards)

    @property
    def shards(self) -> list[Any]:
        """The shards (this object itself, as torchrec's attribute)."""
        return self

    def __repr__(self) -> str:
        return f"EnumerableShardingSpec(shards={list(self)!r})"
