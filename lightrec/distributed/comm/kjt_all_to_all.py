"""KeyedJaggedTensor all-to-all: the input dist that routes sparse features to the ranks owning them.

Every rank holds a KJT for *its* samples whose keys are grouped by destination rank
(``key_splits[d]`` consecutive keys go to rank ``d``; row-wise sharding repeats each key once per
rank after bucketization). Each rank receives, for its own keys, the samples of *every* rank, and
concatenates them in source-rank order, so its batch is the global batch::

    rank 0 (B_0 = 2)   keys: f0 f1 | f2        key_splits = [2, 1]  (f0, f1 -> rank 0; f2 -> rank 1)
    rank 1 (B_1 = 1)   keys: f0 f1 | f2

                       on the wire (from each source)        after the permute (output KJT)
    rank 0 receives    src 0: f0[b0 b1] f1[b0 b1]            f0: [src0 b0, src0 b1, src1 b0]
                       src 1: f0[b0]    f1[b0]               f1: [src0 b0, src0 b1, src1 b0]
                                                             stride = B_0 + B_1 = 3
    rank 1 receives    src 0: f2[b0 b1]   src 1: f2[b0]      f2: [src0 b0, src0 b1, src1 b0]

Two stages, as two awaitables, so a training pipeline can start them early:

1. ``KJTAllToAll(pg, key_splits)(kjt)`` starts a tiny all-to-all of the counts every destination
   will receive (batch size, number of lengths, number of values, weighted?, input consistent?)
   and returns a
   :class:`KJTAllToAllSplitsAwaitable`.
2. Its ``wait()`` reads the counts (one host sync: the receive buffers must be sized), starts the
   lengths, values and weights all-to-alls and returns a :class:`KJTAllToAllTensorsAwaitable`,
   whose ``wait()`` gives the output KJT. It also records ``batch_size_per_rank`` (the batch of
   each source rank, which the output dist needs to send the embeddings back) and, for sequence
   output dists, ``values_per_rank`` and ``value_index`` (the value permutation applied above).

Batch sizes may differ between ranks; a rank may receive no key (``key_splits[rank] == 0``).
Keys may have batch sizes of their own (a variable-batch KJT, ``stride_per_key_per_rank``): then
every key's batch size from every source travels too (one more small all-to-all, only when some
rank's KJT is variable-batch) and the output is a variable-batch KJT whose
``stride_per_key_per_rank[k][s]`` is key ``k``'s batch on source rank ``s`` (inverse indices stay
with the sender). Ranks whose ``key_splits`` differ, or whose KJTs' keys differ (names or order), all
raise :class:`KJTAllToAllError` naming them before any tensor moves (the count exchange carries a
checksum of each rank's ``key_splits`` and one of its keys: two more ints per destination).

Lengths and values travel in ONE all-to-all: each destination's chunk is its lengths followed by
its values, in the values' dtype (int32 lengths -- the usual KJT -- are cast up to int64 ids on the
way and back to int32 on arrival; int64 lengths are cast down only when every count fits int32),
and the receiver cuts each source's chunk back apart. Every collective costs a round trip and, on
gloo, ~0.5 ms of its transport thread's CPU even for a few bytes; the pack and unpack copies of
the ids cost ~0.1 ms at 26 x 2048 ids.

On one host, CPU KJTs go through shared memory instead of gloo (``shm_transport.py``): the counts,
then each destination's ``[lengths | values | weights]`` chunk, written into the sender's segment
and copied out by the receiver -- the same bytes in the same buffers as the gloo path.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import torch
import torch.distributed as dist

from lightrec.distributed.comm._autograd import GroupCollective, per_rank_counts
from lightrec.distributed.comm._jagged import HostSegmentOrder, permute_segments, permute_segments_on_host
from lightrec.distributed.comm.awaitable import Awaitable
from lightrec.distributed.comm.shm_transport import ShmExchange, ShmTransport, shm_transport
from lightrec.sparse import KeyedJaggedTensor
from lightrec.sparse.kjt_dist import sum_by_splits

__all__ = ["KJTAllToAll", "KJTAllToAllError", "KJTAllToAllSplitsAwaitable", "KJTAllToAllTensorsAwaitable"]


class Waitable(Protocol):
    """Work in flight: an async collective's ``dist.Work``, or a shared-memory receive of this file."""

    def wait(self) -> object: ...


# Columns of the per-destination count table exchanged first: ``_VARIABLE`` flags a variable-batch
# KJT (its per-key batch sizes follow in stage 2), ``_SPLITS`` is a checksum of the sender's key_splits,
# ``_KEYS`` one of its KJT's keys.
_BATCH, _LENGTHS, _VALUES, _WEIGHTED, _CONSISTENT, _VARIABLE, _SPLITS, _KEYS = range(8)
_NUM_COLS = 8


def _splits_checksum(splits: list[int]) -> int:
    """The same int on every rank for the same ``key_splits`` (crc32: not Python's salted hash)."""
    return zlib.crc32(",".join(str(n) for n in splits).encode())


def _keys_checksum(keys: list[str]) -> int:
    """The same int on every rank for the same keys in the same order (crc32 of their repr)."""
    return zlib.crc32(repr(list(keys)).encode())


class KJTAllToAllError(ValueError):
    """Ranks called the KJT all-to-all with inputs that do not fit together."""


class KJTAllToAllTensorsAwaitable(Awaitable[KeyedJaggedTensor]):
    """Second stage: lengths/values/weights all-to-alls in flight; ``wait()`` gives the output KJT.

    Attributes:
        batch_size_per_rank: ``[W]`` batch size of each source rank (output stride is their sum).
        values_per_rank: ``[W]`` number of values received from each source rank.
        values_sent_per_rank: ``[W]`` number of values this rank sent to each destination.
        keys: the keys of the output KJT (this rank's ``key_splits`` segment).
    """

    def __init__(
        self,
        keys: list[str],
        batch_size_per_rank: list[int],
        values_per_rank: list[int],
        values_sent_per_rank: list[int],
        works: list[Waitable],
        lengths: torch.Tensor | None,
        values: torch.Tensor,
        weights: torch.Tensor | None,
        keep: tuple[torch.Tensor, ...],
        lengths_per_rank: list[int] | None = None,
        lengths_dtype: torch.dtype | None = None,
        strides: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.keys = keys
        self.batch_size_per_rank = batch_size_per_rank
        self.values_per_rank = values_per_rank
        self.values_sent_per_rank = values_sent_per_rank
        self._value_index: torch.Tensor | HostSegmentOrder | None = None  # the latter: built when read
        self._works = works
        # lengths None: ``values`` is the merged buffer, per source [lengths | values].
        self._lengths, self._values, self._weights = lengths, values, weights
        self._lengths_per_rank = lengths_per_rank
        self._lengths_dtype = lengths_dtype  # the input KJT's: merged lengths are cast back to it
        self._keep = keep
        # Variable-batch only: ``[W * num_keys]`` batch size of each (source, key), source-major.
        self._strides = strides

    @property
    def value_index(self) -> torch.Tensor | None:
        """After ``wait()``: for each output value, its position in the received (source-major)
        buffer; None when no permute was needed (the received order is already key-major)."""
        if isinstance(self._value_index, HostSegmentOrder):
            self._value_index = self._value_index.value_index()
        return self._value_index

    def _wait_impl(self) -> KeyedJaggedTensor:
        for work in self._works:
            work.wait()
        self._keep = ()
        lengths, values, weights = self._lengths, self._values, self._weights
        if lengths is None:
            lengths, values = _split_merged(values, self._lengths_per_rank or [], self.values_per_rank)
            if self._lengths_dtype is not None and lengths.dtype != self._lengths_dtype:
                lengths = lengths.to(self._lengths_dtype)
        num_keys, world_size = len(self.keys), len(self.batch_size_per_rank)
        if self._strides is None:
            sizes = [b for b in self.batch_size_per_rank for _ in range(num_keys)]
        else:
            sizes = [int(n) for n in self._strides.tolist()]
            _check_strides(self.keys, sizes, self._lengths_per_rank or [], world_size)
        if num_keys > 1 and world_size > 1:
            # Received source-major [src][key][sample]; the output is key-major [key][src][sample].
            order = [s * num_keys + k for k in range(num_keys) for s in range(world_size)]
            permute = permute_segments_on_host if lengths.device.type == "cpu" else permute_segments
            lengths, values, weights, self._value_index = permute(lengths, values, weights, sizes, order)
        if self._strides is not None:
            per_key_per_rank = [[sizes[s * num_keys + k] for s in range(world_size)] for k in range(num_keys)]
            return KeyedJaggedTensor(
                keys=self.keys, values=values, weights=weights, lengths=lengths,
                stride_per_key_per_rank=per_key_per_rank,
            )  # fmt: skip
        return KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=sum(self.batch_size_per_rank),
        )


class KJTAllToAllSplitsAwaitable(Awaitable[Awaitable[KeyedJaggedTensor]]):
    """First stage: the count exchange is in flight; ``wait()`` starts the tensor all-to-alls."""

    def __init__(
        self,
        pg: dist.ProcessGroup | None,
        rank: int,
        kjt: KeyedJaggedTensor,
        keys: list[str],
        work: Waitable,
        sent: torch.Tensor,
        received: torch.Tensor,
        shm: ShmTransport | None = None,
        key_splits: list[int] | None = None,
    ) -> None:
        super().__init__()
        self._pg, self._rank, self._keys = pg, rank, keys
        self._key_splits = key_splits if key_splits is not None else [len(keys)]
        self._kjt: KeyedJaggedTensor | None = kjt  # released once the tensors are sent
        self._work, self._sent, self._received = work, sent, received
        self._shm = shm

    def _wait_impl(self) -> KJTAllToAllTensorsAwaitable:
        self._work.wait()
        sent = self._sent.view(-1, _NUM_COLS).tolist()
        recv = self._received.view(-1, _NUM_COLS).tolist()
        kjt, pg = self._kjt, self._pg
        if kjt is None:
            raise RuntimeError("internal error: a KJT all-to-all's second stage started twice")
        self._kjt = None
        _check_counts(self._rank, len(self._keys), kjt, sent, recv, self._key_splits)
        weighted = kjt.weights_or_none() is not None
        # Some rank's KJT is variable-batch (every rank sees every source's flag, so all decide alike):
        # the per-key batch sizes travel first, in a small all-to-all of their own.
        strides = self._exchange_strides(kjt) if any(r[_VARIABLE] for r in recv) else None

        lengths_in = kjt.lengths().contiguous()
        values_in = kjt.values().contiguous()
        recv_lengths, recv_values = [r[_LENGTHS] for r in recv], [r[_VALUES] for r in recv]
        sent_lengths, sent_values = [s[_LENGTHS] for s in sent], [s[_VALUES] for s in sent]
        # One exchange for lengths and values, in the values' dtype (module docstring); int64
        # lengths go down to int32 ids only when every count fits.
        merged = lengths_in.dtype == values_in.dtype or values_in.dtype == torch.int64
        merged = merged or max(sent_values + recv_values, default=0) < 2**31
        weights_in = kjt.weights().contiguous() if weighted else None
        if self._shm is not None:
            return self._shm_exchange(lengths_in, values_in, weights_in, sent, recv, strides)
        out_lengths: torch.Tensor | None
        if merged:
            send = _merge(lengths_in.to(values_in.dtype), values_in, sent_lengths, sent_values)
            out_lengths = None
            out_values = send.new_empty(sum(recv_lengths) + sum(recv_values))
            works = [
                dist.all_to_all_single(
                    out_values, send, [a + b for a, b in zip(recv_lengths, recv_values)],
                    [a + b for a, b in zip(sent_lengths, sent_values)], group=pg, async_op=True,
                )
            ]  # fmt: skip
            keep: tuple[torch.Tensor, ...] = (send,)
        else:
            out_lengths = lengths_in.new_empty(sum(recv_lengths))
            out_values = values_in.new_empty(sum(recv_values))
            works = [
                dist.all_to_all_single(
                    out_lengths, lengths_in, recv_lengths, sent_lengths, group=pg, async_op=True
                ),
                dist.all_to_all_single(out_values, values_in, recv_values, sent_values, group=pg, async_op=True),
            ]
            keep = (lengths_in, values_in)
        out_weights: torch.Tensor | None = None
        if weights_in is not None:
            out_weights = weights_in.new_empty(sum(recv_values))
            works.append(
                dist.all_to_all_single(out_weights, weights_in, recv_values, sent_values, group=pg, async_op=True)
            )
            keep = keep + (weights_in,)
        return KJTAllToAllTensorsAwaitable(
            keys=self._keys,
            batch_size_per_rank=[r[_BATCH] for r in recv],
            values_per_rank=[r[_VALUES] for r in recv],
            values_sent_per_rank=[s[_VALUES] for s in sent],
            works=works,
            lengths=out_lengths,
            values=out_values,
            weights=out_weights,
            keep=keep,
            lengths_per_rank=recv_lengths,
            lengths_dtype=lengths_in.dtype,
            strides=strides,
        )

    def _exchange_strides(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """Every source's batch size of each of this rank's keys, ``[W * num_keys]`` source-major
        (blocking: a few ints; only for variable-batch KJTs)."""
        send = torch.tensor(kjt.stride_per_key(), dtype=torch.int64, device=kjt.lengths().device)
        world_size = len(self._key_splits)
        recv = send.new_empty(world_size * len(self._keys))
        dist.all_to_all_single(recv, send, [len(self._keys)] * world_size, self._key_splits, group=self._pg)
        return recv

    def _shm_exchange(
        self,
        lengths_in: torch.Tensor,
        values_in: torch.Tensor,
        weights_in: torch.Tensor | None,
        sent: list[list[int]],
        recv: list[list[int]],
        strides: torch.Tensor | None = None,
    ) -> KJTAllToAllTensorsAwaitable:
        """Stage 2 through shared memory: each destination's ``[lengths | values | weights]`` chunk
        (lengths in the values' dtype) into this rank's segment; the receiver fills the same merged
        buffers as the gloo path."""
        assert self._shm is not None
        me, vdt = self._rank, values_in.dtype
        vsize = values_in.element_size()
        wsize = weights_in.element_size() if weights_in is not None else 0
        ex = self._shm.start([(s[_LENGTHS] + s[_VALUES]) * vsize + s[_VALUES] * wsize for s in sent])
        lo_l = lo_v = 0
        own: tuple[int, int] = (0, 0)
        for d, row in enumerate(sent):
            n_l, n_v = row[_LENGTHS], row[_VALUES]
            if d == me:
                own = (lo_l, lo_v)
            elif n_l + n_v > 0:
                chunk = ex.send_view(d, vdt, n_l + n_v)
                chunk[:n_l].copy_(lengths_in[lo_l : lo_l + n_l])  # cast to the values' dtype on the way
                chunk[n_l:].copy_(values_in[lo_v : lo_v + n_v])
                if weights_in is not None and n_v > 0:
                    ex.send_view(d, weights_in.dtype, n_v, (n_l + n_v) * vsize).copy_(weights_in[lo_v : lo_v + n_v])
            lo_l, lo_v = lo_l + n_l, lo_v + n_v
        ex.publish()
        recv_lengths, recv_values = [r[_LENGTHS] for r in recv], [r[_VALUES] for r in recv]
        out_values = values_in.new_empty(sum(recv_lengths) + sum(recv_values))
        out_weights = weights_in.new_empty(sum(recv_values)) if weights_in is not None else None
        work = _ShmKJTReceive(ex, me, recv_lengths, recv_values, out_values, out_weights,
                              (lengths_in, values_in, weights_in, own))  # fmt: skip
        return KJTAllToAllTensorsAwaitable(
            keys=self._keys,
            batch_size_per_rank=[r[_BATCH] for r in recv],
            values_per_rank=recv_values,
            values_sent_per_rank=[s[_VALUES] for s in sent],
            works=[work],
            lengths=None,
            values=out_values,
            weights=out_weights,
            keep=(),
            lengths_per_rank=recv_lengths,
            lengths_dtype=lengths_in.dtype,
            strides=strides,
        )


class _ShmKJTReceive:
    """``wait()``: copy every source's chunk (this rank's own straight from its input) into the
    merged receive buffers, then release the sources' chunks."""

    def __init__(
        self,
        ex: ShmExchange,
        rank: int,
        recv_lengths: list[int],
        recv_values: list[int],
        out_values: torch.Tensor,
        out_weights: torch.Tensor | None,
        own: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int]],
    ) -> None:
        self._ex, self._rank = ex, rank
        self._recv_lengths, self._recv_values = recv_lengths, recv_values
        self._out_values, self._out_weights = out_values, out_weights
        # The sender's own chunk, read straight from its input; released once copied.
        self._own: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int]] | None = own

    def wait(self) -> None:
        if self._own is None:
            return  # received already
        lengths_in, values_in, weights_in, (own_l, own_v) = self._own
        out, wout = self._out_values, self._out_weights
        vsize = out.element_size()
        at = wat = 0
        for src, (n_l, n_v) in enumerate(zip(self._recv_lengths, self._recv_values)):
            if src == self._rank:
                out[at : at + n_l].copy_(lengths_in[own_l : own_l + n_l])
                out[at + n_l : at + n_l + n_v].copy_(values_in[own_v : own_v + n_v])
                if wout is not None and weights_in is not None:
                    wout[wat : wat + n_v].copy_(weights_in[own_v : own_v + n_v])
            elif n_l + n_v > 0:
                out[at : at + n_l + n_v].copy_(self._ex.recv_view(src, out.dtype, n_l + n_v))
                if wout is not None and n_v > 0:
                    wout[wat : wat + n_v].copy_(self._ex.recv_view(src, wout.dtype, n_v, (n_l + n_v) * vsize))
            at, wat = at + n_l + n_v, wat + n_v
        self._ex.finish()
        self._own = None


class _ShmCountsReceive:
    """``wait()`` of the count exchange through shared memory: every source's row for this rank."""

    def __init__(self, ex: ShmExchange, rank: int, sent: torch.Tensor, received: torch.Tensor) -> None:
        self._ex, self._rank, self._sent, self._received = ex, rank, sent, received

    def wait(self) -> None:
        rows = self._received.view(-1, _NUM_COLS)
        for src in range(rows.shape[0]):
            if src == self._rank:
                rows[src].copy_(self._sent.view(-1, _NUM_COLS)[src])
            else:
                rows[src].copy_(self._ex.recv_view(src, torch.int64, _NUM_COLS))
        self._ex.finish()


def _merge(lengths: torch.Tensor, values: torch.Tensor, lengths_per_dest: list[int], values_per_dest: list[int]) -> torch.Tensor:
    """``[l_0 | v_0 | l_1 | v_1 | ...]``: each destination's lengths followed by its values."""
    pieces, lo_l, lo_v = [], 0, 0
    for n_l, n_v in zip(lengths_per_dest, values_per_dest, strict=True):
        pieces += [lengths[lo_l : lo_l + n_l], values[lo_v : lo_v + n_v]]
        lo_l, lo_v = lo_l + n_l, lo_v + n_v
    return torch.cat(pieces)


def _split_merged(
    buffer: torch.Tensor, lengths_per_src: list[int], values_per_src: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_merge` on the receiving side: (lengths, values), source-major."""
    lengths, values, offset = [], [], 0
    for n_l, n_v in zip(lengths_per_src, values_per_src, strict=True):
        lengths.append(buffer[offset : offset + n_l])
        values.append(buffer[offset + n_l : offset + n_l + n_v])
        offset += n_l + n_v
    return (
        lengths[0] if len(lengths) == 1 else torch.cat(lengths),
        values[0] if len(values) == 1 else torch.cat(values),
    )


def _ranks_by(recv: list[list[int]], column: int) -> list[list[int]]:
    """The source ranks grouped by their value in count-table ``column`` (one group: they agree)."""
    groups: dict[int, list[int]] = {}
    for src, row in enumerate(recv):
        groups.setdefault(row[column], []).append(src)
    return list(groups.values())


def _check_counts(
    rank: int, num_keys: int, kjt: KeyedJaggedTensor, sent: list[list[int]], recv: list[list[int]],
    key_splits: list[int] | None = None,
) -> None:
    """Fail before the tensor all-to-alls if ranks disagree (on every rank alike: every rank
    receives every source's row)."""
    groups = _ranks_by(recv, _SPLITS)
    if len(groups) > 1:
        raise KJTAllToAllError(
            f"KJTAllToAll: the ranks disagree about key_splits: ranks {' vs ranks '.join(map(str, groups))} "
            f"(rank {rank} has key_splits={key_splits}); every rank must build KJTAllToAll with the same key_splits"
        )
    groups = _ranks_by(recv, _KEYS)
    if len(groups) > 1:
        raise KJTAllToAllError(
            f"KJTAllToAll: the ranks' KJTs have different keys (names or order): ranks "
            f"{' vs ranks '.join(map(str, groups))} (rank {rank} has keys {list(kjt.keys())}); every rank "
            "must pass KJTs with the same keys in the same order"
        )
    flags = {r[_WEIGHTED] for r in recv}
    if len(flags) > 1:
        weighted_ranks = [s for s, r in enumerate(recv) if r[_WEIGHTED]]
        raise KJTAllToAllError(
            f"KJTAllToAll: ranks {weighted_ranks} sent weighted KJTs and the others unweighted ones; "
            "every rank must pass weights for the same features (or none)"
        )
    for src, row in enumerate(recv):
        if not row[_VARIABLE] and row[_LENGTHS] != num_keys * row[_BATCH]:
            raise KJTAllToAllError(
                f"KJTAllToAll: rank {src} sent {row[_LENGTHS]} lengths to rank {rank}, which expects "
                f"{num_keys} keys x batch {row[_BATCH]}; every rank must use the same key_splits"
            )
    # Every rank sees every source's consistency flag, so all of them raise together.
    broken = [src for src, row in enumerate(recv) if not row[_CONSISTENT]]
    if broken:
        raise KJTAllToAllError(
            f"KJTAllToAll: the KJT on rank(s) {broken} has lengths that do not sum to its number of "
            f"values (on this rank, rank {rank}: lengths sum to {sum(s[_VALUES] for s in sent)}, "
            f"values has {kjt.values().numel()}); fix the input (see KeyedJaggedTensor.validate())"
        )


def _check_strides(keys: list[str], sizes: list[int], lengths_per_rank: list[int], world_size: int) -> None:
    """The per-key batch sizes of each source (variable-batch) must add up to the lengths it sent."""
    num_keys = len(keys)
    for src in range(world_size):
        got = sum(sizes[src * num_keys : (src + 1) * num_keys])
        if src < len(lengths_per_rank) and got != lengths_per_rank[src]:
            raise KJTAllToAllError(
                f"KJTAllToAll: rank {src} sent batch sizes {sizes[src * num_keys : (src + 1) * num_keys]} "
                f"for keys {keys} but {lengths_per_rank[src]} lengths; its KJT's stride_per_key_per_rank "
                "does not match its lengths (see KeyedJaggedTensor.validate())"
            )


class KJTAllToAll(GroupCollective):
    """Route each key segment of a KJT to its destination rank (see the module docstring).

    Args:
        pg: process group (None: the default group).
        key_splits: ``[W]`` number of consecutive keys sent to each rank; sums to the number of
            keys of every input KJT. The same on every rank.
    """

    def __init__(self, pg: dist.ProcessGroup | None, key_splits: list[int]) -> None:
        super().__init__(pg)
        self._splits = per_rank_counts(key_splits, self._world_size, "key_splits", "key counts")
        # Per device: ``key_splits`` as a tensor and the destination rank of each key. Built once:
        # a tensor made from host data on CUDA is a blocking copy (a host sync) at every call.
        self._split_tensors: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._checksum = _splits_checksum(self._splits)
        # The keys of the last input and their checksum: the same list every call, in a sharded module.
        self._keys_seen: list[str] | None = None
        self._keys_sum = 0

    @property
    def key_splits(self) -> list[int]:
        return list(self._splits)

    def _splits_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``([W] key_splits, [K] destination rank of each key)`` int64 on ``device`` (cached)."""
        cached = self._split_tensors.get(device)
        if cached is None:
            splits = torch.tensor(self._splits, dtype=torch.int64)
            owner = torch.repeat_interleave(torch.arange(self._world_size), splits)
            cached = (splits.to(device), owner.to(device))
            self._split_tensors[device] = cached
        return cached

    def __call__(self, kjt: KeyedJaggedTensor) -> KJTAllToAllSplitsAwaitable:
        """Start the count exchange for ``kjt`` (keys ``[sum(key_splits)]``, stride ``B_rank``)."""
        keys = kjt.keys()
        if len(keys) != sum(self._splits):
            raise ValueError(
                f"KJTAllToAll(key_splits={self._splits}) expects KJTs with {sum(self._splits)} keys, "
                f"got {len(keys)}: {keys}"
            )
        world_size, batch = self._world_size, kjt.stride()
        lengths = kjt.lengths()
        device = lengths.device
        splits_t, owner = self._splits_on(device)
        # A variable-batch KJT whose keys all have the stride's batch is laid out as a fixed one.
        strides = kjt.stride_per_key() if kjt.variable_stride_per_key() else None
        variable = strides is not None and any(s != batch for s in strides)
        if variable:
            assert strides is not None
            if lengths.numel() != sum(strides):
                raise KJTAllToAllError(
                    f"KJTAllToAll: the KJT's stride_per_key_per_rank={kjt.stride_per_key_per_rank()} gives "
                    f"{sum(strides)} lengths, it has {lengths.numel()}; fix the input (see KeyedJaggedTensor.validate())"
                )
            key_of = torch.repeat_interleave(
                torch.arange(len(keys), device=device), torch.tensor(strides, device=device), output_size=sum(strides)
            )
            per_key = torch.zeros(len(keys), dtype=torch.int64, device=device).index_add_(
                0, key_of, lengths.to(torch.int64)
            )
        elif len(keys) > 0 and batch > 0:
            per_key = lengths.view(len(keys), batch).sum(dim=1).to(torch.int64)
        else:
            per_key = torch.zeros(len(keys), dtype=torch.int64, device=device)
        values_per_dest = torch.zeros(world_size, dtype=torch.int64, device=device)
        values_per_dest.index_add_(0, owner, per_key)
        table = torch.empty((world_size, _NUM_COLS), dtype=torch.int64, device=device)
        table[:, _BATCH] = batch
        if variable:
            assert strides is not None
            table[:, _LENGTHS] = torch.tensor(sum_by_splits(strides, self._splits), dtype=torch.int64, device=device)
        else:
            table[:, _LENGTHS] = splits_t * batch
        table[:, _VALUES] = values_per_dest
        table[:, _WEIGHTED] = int(kjt.weights_or_none() is not None)
        # Checked on device (no host sync here) and shipped, so every rank can raise together.
        table[:, _CONSISTENT] = per_key.sum() == kjt.values().numel()
        table[:, _VARIABLE] = int(variable)
        table[:, _SPLITS] = self._checksum
        if keys != self._keys_seen:
            self._keys_seen, self._keys_sum = list(keys), _keys_checksum(keys)
        table[:, _KEYS] = self._keys_sum
        sent = table.view(-1)
        received = torch.empty_like(sent)
        shm = shm_transport(self._pg) if device.type == "cpu" and world_size > 1 else None
        work: Waitable
        if shm is not None:
            ex = shm.start([0 if d == self._rank else 8 * _NUM_COLS for d in range(world_size)])
            for d in range(world_size):
                if d != self._rank:
                    ex.send_view(d, torch.int64, _NUM_COLS).copy_(table[d])
            ex.publish()
            work = _ShmCountsReceive(ex, self._rank, sent, received)
        else:
            work = dist.all_to_all_single(received, sent, group=self._pg, async_op=True)
        start = sum(self._splits[: self._rank])
        my_keys = list(keys[start : start + self._splits[self._rank]])
        return KJTAllToAllSplitsAwaitable(
            self._pg, self._rank, kjt, my_keys, work, sent, received, shm, key_splits=self._splits
        )
