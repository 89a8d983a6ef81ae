"""Tensor operations of managed-collision tables: bucket routing and hashing.

Everything here is vectorised over ids (no Python loop per id) and written in plain torch ops, so
the same code runs on CPU and GPU and compiles under TorchScript for the frozen serving remapper.

A managed-collision table gives each raw id its own *slot* (a row of the embedding table). Its
state is kept **slot-ordered** -- ``slot_ids[s]`` is the raw id living in slot ``s`` (``EMPTY_ID``
= ``2**63 - 1`` when the slot is free; never a valid id, ids are below ``input_hash_size <= 2**63 -
1``); ``lightrec.modules.managed_collision.mch_index`` derives the search index from it.

Buckets: a table's slots are split into ``B`` contiguous *segments* and a raw id may only live in
the segment of its bucket (``block_bucket``: ``id // ceil(input_hash_size / B)``, torchrec's rule).
Buckets are independent sub-tables, so a row-wise sharded table (whole buckets per rank) makes
exactly the decisions of the unsharded one, and resharding moves whole buckets: every id keeps its
slot. The last slot of every segment is that bucket's *default row*, where ids without a slot go.
"""

from __future__ import annotations

import torch

__all__ = [
    "EMPTY_ID",
    "block_bucket",
    "bucket_segments",
    "hashed_unit",
    "int64_ids",
    "mix64",
    "mix64_hash",
    "uniform_block",
]

EMPTY_ID = 2**63 - 1
"""Raw id of a free slot (``torch.iinfo(torch.int64).max``, torchrec's marker too)."""

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors: a well-mixed 64-bit hash (two's-complement wrapping
    arithmetic, as torch's integer kernels do on every backend; ``tests/modules/managed_collision/test_ops.py``
    checks it against Python's unbounded integers).

    Args:
        x: int64 tensor of any shape.

    Returns:
        int64 tensor of the same shape (all 64 bits mixed; may be negative).
    """
    # the constants as literals: TorchScript compiles literals, not module globals (a remapper
    # scripted directly failed on them); they equal _GOLDEN, _MIX1, _MIX2 (tests/modules/managed_collision)
    z = x + -7046029254386353131  # 0x9E3779B97F4A7C15
    z = (z ^ _shr(z, 30)) * -4658895280553007687  # 0xBF58476D1CE4E5B9
    z = (z ^ _shr(z, 27)) * -7723592293110705685  # 0x94D049BB133111EB
    return z ^ _shr(z, 31)


def block_bucket(values: torch.Tensor, input_hash_size: int, buckets: int) -> torch.Tensor:
    """Bucket of each raw id: ``id // ceil(input_hash_size / buckets)`` (torchrec's routing rule).

    With ``input_hash_size == 0`` (torchrec's "unbounded" for the hash module) the bucket is
    ``id % buckets`` instead.

    Args:
        values: ``[N]`` int64 ids in ``[0, input_hash_size)``.
        input_hash_size: size of the id space.
        buckets: number of buckets ``B``.

    Returns:
        ``[N]`` int64 bucket indices in ``[0, B)``.
    """
    if buckets == 1:
        return torch.zeros_like(values)
    if input_hash_size == 0:
        return torch.remainder(values, buckets)
    block = -(-input_hash_size // buckets)
    return torch.div(values, block, rounding_mode="floor").clamp_(max=buckets - 1)


def bucket_segments(zch_size: int, buckets: int) -> list[int]:
    """``B + 1`` slot offsets of the bucket segments: ``[b * zch_size // B for b in 0..B]``.

    Raises:
        ValueError: fewer than two slots per bucket (a bucket needs a default row and a slot).
    """
    if buckets < 1 or zch_size < 2 * buckets:
        raise ValueError(
            f"zch_size={zch_size} cannot be split into buckets={buckets} segments of at least 2 slots "
            "(each bucket keeps one default row); use fewer buckets or a larger table"
        )
    return [b * zch_size // buckets for b in range(buckets + 1)]


def check_input_hash_size(input_hash_size: int, where: str) -> None:
    """``input_hash_size`` must be an int in ``[0, 2**63 - 1]`` (0: unbounded, hash module only)."""
    if isinstance(input_hash_size, bool) or not isinstance(input_hash_size, int):
        raise TypeError(f"{where}: input_hash_size must be an int, got {input_hash_size!r}")
    if not 0 <= input_hash_size <= EMPTY_ID:
        raise ValueError(
            f"{where}: input_hash_size must be in [0, 2**63 - 1] (ids are int64 below it), got {input_hash_size}"
        )


def int64_ids(values: torch.Tensor) -> torch.Tensor:
    """Raw ids as int64: a ``uint64`` id keeps its 64 bits (``2**64 - 1`` becomes ``-1``, then folded
    into the id space like any negative id, as lightrec's data readers do), other integer dtypes
    their value (``values`` itself when already int64).

    Args:
        values: ``[N]`` ids of any integer dtype.

    Returns:
        ``[N]`` int64 ids.
    """
    if values.dtype == torch.uint64:  # (.long() would give the same bits; view makes no copy)
        return values.view(torch.int64)
    return values.long()


def mix64_hash(values: torch.Tensor, input_hash_size: int) -> torch.Tensor:
    """An ``input_hash_func`` that spreads any int64 ids over ``[0, input_hash_size)``.

    Managed-collision tables split the id space into equal blocks (their buckets, and ranks when
    sharded); ids that all sit at one end of it (small sequential ids) would share one block. Pass
    ``input_hash_func=mix64_hash`` to spread them (collisions among 2**63 values are negligible).
    """
    return torch.remainder(mix64(values.long()), input_hash_size)


def uniform_block(rows: int, dim: int, seed: int, low: float, high: float, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, dim]`` values uniform in ``[low, high)``, a pure function of ``seed`` (CPU).

    Element ``i`` (row-major) is ``low + (high - low) * u_i`` with ``u_i`` the top 53 bits of
    SplitMix64's ``i``-th output from ``seed``, computed in float64 and rounded to ``dtype`` once: a
    counter-based draw, so the native op ``torch.ops.lightrec_mch.uniform_rows``
    (``lightrec/csrc/mch_step.cpp``) gives the same bits, and so does any device.

    Args:
        rows / dim: the block's shape.
        seed: any int in ``[0, 2**63)``.
        low / high: the range.
        dtype: floating dtype of the result.
    """
    counter = torch.arange(rows * dim, dtype=torch.int64)
    unit = _shr(mix64(counter * _GOLDEN + seed), 11).to(torch.float64).mul_(2.0**-53)
    return unit.mul_(high - low).add_(low).to(dtype).view(rows, dim)


def hashed_unit(keys: torch.Tensor, *salts: int) -> torch.Tensor:
    """A uniform draw in ``[0, 1)`` per key that is a pure function of the key and the ``salts``.

    Each salt is folded in with one more SplitMix64 mix (``mix64(mix64(key) + salt)`` and so on),
    and the top 53 bits of the result give the float64: the same key and salts draw the same value
    on every rank, device and run, and different keys (or salts) draw independently for all
    practical purposes -- a counter-based stand-in for ``torch.rand`` where decisions must not
    depend on which process makes them, or in which order.

    Args:
        keys: int64 tensor of any shape (ids).
        salts: ints in ``[-2**63, 2**63)`` (an iteration, a seed).

    Returns:
        float64 tensor of the shape of ``keys``.
    """
    z = mix64(keys.long())
    for salt in salts:
        z = mix64(z + salt)
    return _shr(z, 11).to(torch.float64).mul_(2.0**-53)
