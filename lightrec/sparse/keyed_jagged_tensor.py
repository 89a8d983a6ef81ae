"""``KeyedJaggedTensor`` (KJT): every sparse feature of a batch in one flat, key-major layout.

Layout (keys ``product``, ``user``; batch of 2, so ``stride() == 2``)::

    key       |  product          |  user
    sample    |  0         |  1   |  0      |  1
    ----------+------------+------+---------+--------
    values    |  1, 2, 1   |  5   |  2, 3   |  4, 1      values  = [1, 2, 1, 5, 2, 3, 4, 1]  [N]
    lengths   |  3         |  1   |  2      |  2         lengths = [3, 1, 2, 2]              [K * B]
    offsets   |  0         |  3   |  4      |  6  (8)    offsets = [0, 3, 4, 6, 8]           [K * B + 1]

    length_per_key = [4, 4]   offset_per_key = [0, 4, 8]   index_per_key = {"product": 0, "user": 1}

``lengths`` is key-major: the lengths of key ``k`` are ``lengths[k * B:(k + 1) * B]``. ``weights``
(optional, ``[N]``) carries one score per id for weighted features. This is exactly the
``indices``/``offsets`` layout that batched embedding kernels (fbgemm TBE) consume.

A *variable-batch* KJT (torchrec's VBE input) gives each key its own batch size:
``stride_per_key_per_rank`` ``[F][R]`` and, to expand pooled results back to one row per sample,
``inverse_indices`` ``(keys, [F, B])``; see :mod:`lightrec.sparse.variable_batch` for the layout.
"""

from typing import Dict, List, Optional, Tuple

import torch

import lightrec.sparse.kjt_layout as kjt_layout
import lightrec.sparse.kjt_transforms as kjt_transforms
from lightrec.sparse.jagged import (
    JaggedTensor,
    JaggedTensorMeta,
    SparseValueError,
    lengths_or_derive,
    offsets_or_derive,
)
from lightrec.sparse.kjt_checks import validate_kjt_layout
from lightrec.sparse.kjt_device import (
    copy_into,
    empty_like_tensors,
    inverse_indices_empty_like,
    inverse_indices_pinned,
    inverse_indices_to,
    num_bytes,
    pin_tensors,
    tensors_to,
)
from lightrec.sparse.kjt_dist import dist_labels, dist_splits, dist_tensors
from lightrec.sparse.kjt_printing import kjt_repr, kjt_str
from lightrec.sparse.variable_batch import cumsum_list, regroup_received

__all__ = ["KeyedJaggedTensor", "SparseValueError"]


class KeyedJaggedTensor(metaclass=JaggedTensorMeta):
    """Several jagged features (keys) over one batch, stored flat (see the module docstring).

    Args:
        keys: feature names, unique.
        values: ``[N]`` ids of every key and sample, key-major.
        weights: optional ``[N]`` per-id weights.
        lengths: ``[K * B]`` ids per (key, sample). Give ``lengths`` or ``offsets``.
        offsets: ``[K * B + 1]`` running sum of ``lengths``.
        stride: batch size ``B``; inferred as ``len(lengths) // len(keys)`` when omitted.
        stride_per_key_per_rank: ``[F][R]`` batch size of each key from each rank: a variable-batch
            KJT (key ``k`` has ``sum(stride_per_key_per_rank[k])`` lengths). An ``[F, R]`` int
            tensor is accepted too (torchrec's form).
        inverse_indices: ``(keys, [F, B])``: for each key, the row of its batch that every sample
            of the full batch ``B`` uses (a variable-batch KJT; see ``variable_batch.py``).
        stride_per_key / length_per_key / lengths_offset_per_key / offset_per_key / index_per_key:
            optional precomputed caches.
        validate: check the layout (``validate()``) while constructing.
    """

    def __init__(
        self,
        keys: List[str],
        values: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        lengths: Optional[torch.Tensor] = None,
        offsets: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Optional[List[List[int]]] = None,
        stride_per_key: Optional[List[int]] = None,
        length_per_key: Optional[List[int]] = None,
        lengths_offset_per_key: Optional[List[int]] = None,
        offset_per_key: Optional[List[int]] = None,
        index_per_key: Optional[Dict[str, int]] = None,
        jt_dict: Optional[Dict[str, JaggedTensor]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("KeyedJaggedTensor needs lengths or offsets to know where each sample's ids start")
        self._keys: List[str] = keys
        self._values: torch.Tensor = values
        self._weights: Optional[torch.Tensor] = weights
        self._lengths: Optional[torch.Tensor] = lengths
        self._offsets: Optional[torch.Tensor] = offsets
        self._stride: Optional[int] = stride
        self._stride_per_key_per_rank: Optional[List[List[int]]] = stride_per_key_per_rank
        self._stride_per_key: Optional[List[int]] = stride_per_key
        self._lengths_offset_per_key: Optional[List[int]] = lengths_offset_per_key
        self._inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = inverse_indices
        self._length_per_key: Optional[List[int]] = length_per_key
        self._offset_per_key: Optional[List[int]] = offset_per_key
        self._index_per_key: Optional[Dict[str, int]] = index_per_key
        self._jt_dict: Optional[Dict[str, JaggedTensor]] = jt_dict

    @staticmethod
    def _build(
        keys: List[str], values: torch.Tensor, weights: Optional[torch.Tensor], lengths: torch.Tensor,
        stride: Optional[int], stride_per_key_per_rank: Optional[List[List[int]]],
        length_per_key: Optional[List[int]], inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
    ) -> "KeyedJaggedTensor":  # fmt: skip
        """A KJT from lengths, with no offsets and no derived caches but ``length_per_key``.

        What the static constructors build; every argument is passed explicitly, as TorchScript
        needs. TorchScript compiles static methods as free functions: one that names the class,
        called from a method while the class compiles, compiles the class a second time, so the
        methods build with :meth:`_derive` instead.
        """
        return KeyedJaggedTensor(
            keys=keys, values=values, weights=weights, lengths=lengths, offsets=None, stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank, stride_per_key=None,
            length_per_key=length_per_key, lengths_offset_per_key=None, offset_per_key=None,
            index_per_key=None, jt_dict=None, inverse_indices=inverse_indices,
        )  # fmt: skip

    def _derive(
        self, keys: List[str], values: torch.Tensor, weights: Optional[torch.Tensor], lengths: torch.Tensor,
        stride: Optional[int], stride_per_key_per_rank: Optional[List[List[int]]],
        length_per_key: Optional[List[int]], inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
    ) -> "KeyedJaggedTensor":  # fmt: skip
        """:meth:`_build` for the methods (the transforms' results); ``self`` only gives access."""
        return KeyedJaggedTensor(
            keys=keys, values=values, weights=weights, lengths=lengths, offsets=None, stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank, stride_per_key=None,
            length_per_key=length_per_key, lengths_offset_per_key=None, offset_per_key=None,
            index_per_key=None, jt_dict=None, inverse_indices=inverse_indices,
        )  # fmt: skip

    # ---------------------------------------------------------------- constructors
    @staticmethod
    def from_offsets_sync(
        keys: List[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Optional[List[List[int]]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
    ) -> "KeyedJaggedTensor":
        """Build from offsets and compute the per-key caches now (one host sync; none on ``meta``)."""
        kjt = KeyedJaggedTensor(
            keys=keys, values=values, weights=weights, lengths=None, offsets=offsets, stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank, stride_per_key=None, length_per_key=None,
            lengths_offset_per_key=None, offset_per_key=None, index_per_key=None, jt_dict=None,
            inverse_indices=inverse_indices,
        )  # fmt: skip
        return kjt.sync()

    @staticmethod
    def from_lengths_sync(
        keys: List[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Optional[List[List[int]]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
    ) -> "KeyedJaggedTensor":
        """Build from lengths and compute the per-key caches now (one host sync; none on ``meta``)."""
        kjt = KeyedJaggedTensor._build(
            keys, values, weights, lengths, stride, stride_per_key_per_rank, None, inverse_indices
        )
        return kjt.sync()

    @staticmethod
    def from_jt_dict(jt_dict: Dict[str, JaggedTensor], variable_batch: bool = False) -> "KeyedJaggedTensor":
        """Stack ``{key: JaggedTensor}`` in the dict's key order (synced, as torchrec: one host read).

        As torchrec documents, every JaggedTensor must have the same batch size (one length per
        sample, also for samples without ids): JaggedTensors of different batch sizes raise
        ``SparseValueError`` naming them, unless ``variable_batch=True`` asks for a variable-batch
        KJT (``stride_per_key_per_rank`` ``[[B_k]]``, torchrec's VBE input). Either every
        JaggedTensor has weights or none does.
        """
        keys = list(jt_dict.keys())
        if len(keys) == 0:
            return KeyedJaggedTensor.empty()
        jt_values: List[torch.Tensor] = []
        jt_weights: List[Optional[torch.Tensor]] = []  # typed: TorchScript warns on a comprehension
        jt_lengths: List[torch.Tensor] = []
        for k in keys:
            jt = jt_dict[k]
            jt_values.append(jt.values())
            jt_weights.append(jt.weights_or_none())
            jt_lengths.append(jt.lengths())
        values, weights, lengths, stride, stride_per_key_per_rank = kjt_transforms.stack_features(
            keys, jt_values, jt_weights, jt_lengths, variable_batch
        )
        kjt = KeyedJaggedTensor._build(keys, values, weights, lengths, stride, stride_per_key_per_rank, None, None)
        return kjt.sync()

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        values_dtype: Optional[torch.dtype] = None,
        weights_dtype: Optional[torch.dtype] = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "KeyedJaggedTensor":
        """A KJT with no keys, no samples and no values."""
        w_dtype = weights_dtype if weights_dtype is not None else torch.float32
        weights = torch.empty(0, dtype=w_dtype, device=device) if is_weighted else None
        values = torch.empty(0, dtype=values_dtype if values_dtype is not None else torch.int64, device=device)
        lengths = torch.empty(0, dtype=lengths_dtype, device=device)
        return KeyedJaggedTensor._build([], values, weights, lengths, 0, None, None, None)

    @staticmethod
    def empty_like(kjt: "KeyedJaggedTensor", device: Optional[torch.device] = None) -> "KeyedJaggedTensor":
        """A KJT with the keys and batch sizes of ``kjt`` and no ids; with ``device``, torchrec's
        device-copy form: uninitialised tensors of ``kjt``'s shapes on ``device``."""
        w = kjt.weights_or_none()
        if device is not None:
            offsets = kjt.offsets_or_none()
            values, weights, lengths, offsets = empty_like_tensors(
                kjt.values(), w, kjt.lengths(), offsets, device
            )
            return KeyedJaggedTensor(
                keys=kjt.keys(), values=values, weights=weights, lengths=lengths, offsets=offsets,
                stride=kjt.stride(), stride_per_key_per_rank=kjt._stride_per_key_per_rank,
                stride_per_key=None, length_per_key=kjt._length_per_key, lengths_offset_per_key=None,
                offset_per_key=kjt._offset_per_key, index_per_key=None, jt_dict=None,
                inverse_indices=inverse_indices_empty_like(kjt._inverse_indices, device),
            )  # fmt: skip
        values = torch.empty(0, dtype=kjt.values().dtype, device=kjt.device())
        weights = torch.empty(0, dtype=w.dtype, device=w.device) if w is not None else None
        lengths = torch.zeros_like(kjt.lengths())
        return KeyedJaggedTensor._build(
            kjt.keys(), values, weights, lengths, kjt.stride(), kjt._stride_per_key_per_rank, None, None
        )

    @staticmethod
    def concat(kjt_list: List["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Put the keys of several KJTs side by side (one batch size, or all variable-batch).

        A single ``torch.fx`` node when traced (the loop over the list needs real KJTs).
        """
        return _kjt_concat(kjt_list)

    # ---------------------------------------------------------------- accessors
    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        w = self._weights
        if w is None:
            raise ValueError("this KeyedJaggedTensor has no weights; check weights_or_none() first")
        return w

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        lengths = lengths_or_derive(self._lengths, self._offsets, "KeyedJaggedTensor")
        self._lengths = lengths
        return lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        offsets = offsets_or_derive(self._lengths, self._offsets, "KeyedJaggedTensor")
        self._offsets = offsets
        return offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def stride(self) -> int:
        """Batch size ``B`` (samples per key); for a variable-batch KJT the width of its inverse
        indices, else the largest batch of a key (torchrec's rule)."""
        stride = self._stride
        if stride is None:
            lengths = self._lengths
            # empty offsets (no samples) hold no lengths, as torchrec reads them
            num_lengths = lengths.numel() if lengths is not None else max(self.offsets().numel() - 1, 0)
            stride = kjt_layout.infer_stride(
                len(self._keys), self._stride_per_key_per_rank, self._inverse_indices, num_lengths
            )
            self._stride = stride
        return stride

    def stride_per_key(self) -> List[int]:
        """Batch size of each key (all ``stride()`` unless variable-batch)."""
        spk = self._stride_per_key
        if spk is None:
            strides = self._stride_per_key_per_rank
            spk = kjt_layout.row_sums(strides) if strides is not None else [self.stride()] * len(self._keys)
            self._stride_per_key = spk
        return spk

    def stride_per_key_per_rank(self) -> List[List[int]]:
        """``[F][R]`` batch size of each key from each rank (``[]`` for a fixed-batch KJT, like torchrec)."""
        strides = self._stride_per_key_per_rank
        return strides if strides is not None else []

    def variable_stride_per_key(self) -> bool:
        """Whether keys have their own batch sizes (``stride_per_key_per_rank`` was given)."""
        return self._stride_per_key_per_rank is not None

    def inverse_indices(self) -> Tuple[List[str], torch.Tensor]:
        """``(keys, [F, B])`` of a variable-batch KJT (raises when it has none)."""
        inverse = self._inverse_indices
        if inverse is None:
            raise ValueError("this KeyedJaggedTensor has no inverse_indices; check inverse_indices_or_none() first")
        return inverse

    def inverse_indices_or_none(self) -> Optional[Tuple[List[str], torch.Tensor]]:
        return self._inverse_indices

    def length_per_key(self) -> List[int]:
        """Number of ids of each key over the batch (host list; computing it syncs once).

        On the ``meta`` device there is nothing to read: like torchrec, the ids are dealt evenly
        over the keys (placeholders that let a meta KJT flow through shape-only code).
        """
        lpk = self._length_per_key
        if lpk is None:
            num_keys = len(self._keys)
            if num_keys == 0 or self._values.device.type == "meta":
                lpk = kjt_layout.meta_length_per_key(self._values.numel(), num_keys)
            else:
                spk = self.stride_per_key() if self._stride_per_key_per_rank is not None else None
                lpk = kjt_layout.sum_length_per_key(self.lengths(), num_keys, spk)
            self._length_per_key = lpk
        return lpk

    def length_per_key_or_none(self) -> Optional[List[int]]:
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        """Start of each key's ids in ``values`` (``len(keys) + 1`` entries)."""
        opk = self._offset_per_key
        if opk is None:
            opk = cumsum_list(self.length_per_key())
            self._offset_per_key = opk
        return opk

    def offset_per_key_or_none(self) -> Optional[List[int]]:
        return self._offset_per_key

    def index_per_key(self) -> Dict[str, int]:
        """``{key: position}``."""
        ipk = self._index_per_key
        if ipk is None:
            ipk = kjt_layout.positions_of(self._keys)
            self._index_per_key = ipk
        return ipk

    def lengths_offset_per_key(self) -> List[int]:
        """Start of each key's lengths in ``lengths()`` (multiples of the stride unless variable-batch)."""
        lopk = self._lengths_offset_per_key
        if lopk is None:
            variable = self._stride_per_key_per_rank is not None
            num_keys = len(self._keys)
            lopk = cumsum_list(self.stride_per_key()) if variable else kjt_layout.multiples(self.stride(), num_keys + 1)
            self._lengths_offset_per_key = lopk
        return lopk

    def sync(self) -> "KeyedJaggedTensor":
        """Compute the host-side caches (length/offset per key) now."""
        self.length_per_key()
        self.offset_per_key()
        return self

    def unsync(self) -> "KeyedJaggedTensor":
        """Forget the host-side caches (they are recomputed on demand)."""
        self._length_per_key = None
        self._offset_per_key = None
        return self

    # ---------------------------------------------------------------- transforms
    def split(self, segments: List[int]) -> List["KeyedJaggedTensor"]:
        """Split the keys into consecutive groups of ``segments[i]`` keys (views where possible)."""
        kjt_transforms.check_split_segments(segments, len(self._keys))
        stride = self.stride()
        lpk = self.length_per_key()
        lopk = self.lengths_offset_per_key()
        lengths = self.lengths()
        weights = self._weights
        all_strides = self._stride_per_key_per_rank
        out: List[KeyedJaggedTensor] = []
        for k0, k1, v0, v1 in kjt_transforms.split_bounds(segments, lpk):
            strides = all_strides[k0:k1] if all_strides is not None else None
            out.append(
                self._derive(
                    self._keys[k0:k1], self._values[v0:v1], weights[v0:v1] if weights is not None else None,
                    lengths[lopk[k0] : lopk[k1]], stride, strides, lpk[k0:k1], self._inverse_indices,
                )  # fmt: skip
            )
        return out

    def permute(
        self, indices: List[int], indices_tensor: Optional[torch.Tensor] = None
    ) -> "KeyedJaggedTensor":
        """New KJT whose key ``i`` is this KJT's key ``indices[i]`` (keys may repeat or be left out)."""
        kjt_transforms.check_permute_indices(indices, self._keys)
        keys = [self._keys[i] for i in indices]
        lpk = self.length_per_key()
        strides = self._stride_per_key_per_rank
        if strides is not None:  # keys of different batch sizes: no [K, B] view, whole segments move
            lengths, values, weights = kjt_transforms.permute_variable_batch(
                indices, self.stride_per_key(), lpk, self.lengths(), self._values, self._weights
            )
            new_strides = [strides[i] for i in indices]
            new_lpk = [lpk[i] for i in indices]
            inverse = self._inverse_indices
            return self._derive(keys, values, weights, lengths, self.stride(), new_strides, new_lpk, inverse)
        lengths, values, weights = kjt_transforms.permute_fixed_batch(
            indices, indices_tensor, self.lengths(), self._values, self._weights, lpk, self.stride()
        )
        return self._derive(keys, values, weights, lengths, self.stride(), None, [lpk[i] for i in indices], None)

    @torch.jit.unused
    def to_fixed_batch(self) -> "KeyedJaggedTensor":
        """A variable-batch KJT expanded to one bag per sample of the full batch (itself otherwise).

        Bag ``b`` of key ``k`` becomes bag ``inverse_indices[1][i_k][b]`` of ``k``'s own batch, so a
        pooled lookup of the result equals the variable-batch lookup expanded by its inverse
        indices. Used by the sharded collections, which move fixed-batch KJTs between ranks.
        """
        strides = self._stride_per_key_per_rank
        if strides is None:
            return self
        inverse_keys, rows = kjt_transforms.checked_inverse_indices(self._keys, strides, self._inverse_indices)
        jt_parts = [(jt.lengths(), jt.values(), jt.weights_or_none()) for jt in self.to_dict().values()]
        values, weights, lengths = kjt_transforms.expand_to_fixed_batch(
            self._keys, jt_parts, inverse_keys, rows, self._values, self.lengths()
        )
        return self._derive(self._keys, values, weights, lengths, rows.size(-1), None, None, None)

    def permute_to_keys(self, keys: List[str]) -> "KeyedJaggedTensor":
        """This KJT with its keys in the order ``keys`` (itself when already so ordered).

        Raises ``KeyError`` naming the first key of ``keys`` that this KJT lacks.
        """
        if keys == self._keys:
            return self
        return self.permute(kjt_transforms.key_positions(keys, self.index_per_key(), self._keys), None)

    def to_dict(self, compute_offsets: bool = True) -> Dict[str, JaggedTensor]:
        """``{key: JaggedTensor}`` views of each feature (cached: a later call returns the first result).

        ``compute_offsets`` gives each JaggedTensor its offsets too (torchrec's default; one
        running sum over all keys of a fixed-batch KJT), else only its lengths.
        """
        jt_dict = self._jt_dict
        if jt_dict is not None:
            return jt_dict
        lengths = self.lengths()
        parts = kjt_transforms.slice_per_key(
            self._values, self._weights, lengths, self.offset_per_key(), self.lengths_offset_per_key()
        )
        key_offsets: List[torch.Tensor] = []
        if compute_offsets:
            key_offsets = kjt_transforms.offsets_per_key(
                [part[2] for part in parts], lengths, self.stride(), self._stride_per_key_per_rank is not None
            )
        new_dict: Dict[str, JaggedTensor] = {}
        for i in range(len(parts)):
            values, weights, key_lengths = parts[i]
            offsets: Optional[torch.Tensor] = key_offsets[i] if compute_offsets else None
            new_dict[self._keys[i]] = JaggedTensor(values=values, weights=weights, lengths=key_lengths, offsets=offsets)
        self._jt_dict = new_dict
        return new_dict

    def __getitem__(self, key: str) -> JaggedTensor:
        index = self.index_per_key()
        if key not in index:
            raise KeyError(f"feature '{key}' is not in this KeyedJaggedTensor; its keys are {self._keys}")
        return self.to_dict(True)[key]  # every argument: TorchScript drops defaults inside the class

    def to(
        self, device: torch.device, non_blocking: bool = False, dtype: Optional[torch.dtype] = None
    ) -> "KeyedJaggedTensor":
        """Copy every tensor to ``device``; host-side caches are kept (no sync).

        ``dtype`` converts the weights (torchrec's argument; ids and lengths keep their dtypes).
        """
        values, weights, lengths, offsets = tensors_to(
            self._values, self._weights, self._lengths, self._offsets, device, non_blocking, dtype
        )
        inverse_indices = inverse_indices_to(self._inverse_indices, device, non_blocking)
        return self._copy_with(values, weights, lengths, offsets, inverse_indices)

    @torch.jit.unused
    def pin_memory(self) -> "KeyedJaggedTensor":
        """Copy into page-locked host memory so a later ``to(cuda, non_blocking=True)`` is async."""
        values, weights, lengths, offsets = pin_tensors(self._values, self._weights, self._lengths, self._offsets)
        return self._copy_with(values, weights, lengths, offsets, inverse_indices_pinned(self._inverse_indices))

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (CUDA caching-allocator safety)."""
        for t in (self._values, self._weights, self._lengths, self._offsets):
            if t is not None:
                t.record_stream(stream)

    def _copy_with(
        self, values: torch.Tensor, weights: Optional[torch.Tensor], lengths: Optional[torch.Tensor],
        offsets: Optional[torch.Tensor], inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
    ) -> "KeyedJaggedTensor":  # fmt: skip
        """These keys and host-side caches over other tensors (a copy elsewhere: same sizes)."""
        return KeyedJaggedTensor(
            keys=self._keys, values=values, weights=weights, lengths=lengths, offsets=offsets,
            stride=self._stride, stride_per_key_per_rank=self._stride_per_key_per_rank, stride_per_key=None,
            length_per_key=self._length_per_key, lengths_offset_per_key=None,
            offset_per_key=self._offset_per_key, index_per_key=self._index_per_key, jt_dict=None,
            inverse_indices=inverse_indices,
        )  # fmt: skip

    def copy_(self, kjt: "KeyedJaggedTensor", non_blocking: bool = False) -> "KeyedJaggedTensor":
        """Copy ``kjt``'s tensors into this KJT's, in place, and take its host-side layout (torchrec's).

        For a KJT made by ``empty_like(kjt, device)``: the tensors must have ``kjt``'s shapes; a
        tensor only one side has (weights, lengths, offsets, inverse indices) is left as it is.
        """
        self._stride = kjt._stride
        self._stride_per_key_per_rank = kjt._stride_per_key_per_rank
        self._stride_per_key = kjt._stride_per_key
        self._length_per_key = kjt._length_per_key
        self._lengths_offset_per_key = kjt._lengths_offset_per_key
        self._offset_per_key = kjt._offset_per_key
        self._index_per_key = kjt._index_per_key
        self._jt_dict = None  # views of the old contents would go stale; rebuilt on demand
        self._values.copy_(kjt._values, non_blocking=non_blocking)
        copy_into(self._weights, kjt._weights, non_blocking)
        copy_into(self._lengths, kjt._lengths, non_blocking)
        copy_into(self._offsets, kjt._offsets, non_blocking)
        own = self._inverse_indices
        other = kjt._inverse_indices
        if own is not None and other is not None:
            self._inverse_indices = (other[0], own[1].copy_(other[1], non_blocking=non_blocking))
        return self

    def size_in_bytes(self) -> int:
        """Bytes of the tensors this KJT holds (torchrec's count: the per-rank batch sizes as int32)."""
        size = num_bytes([self._values, self._weights, self._lengths, self._offsets])
        strides = self._stride_per_key_per_rank
        if strides is not None:
            for per_rank in strides:
                size += 4 * len(per_rank)
        return size

    def _key_indices(self) -> Dict[str, int]:
        """``index_per_key()`` under torchrec's private name."""
        return self.index_per_key()

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """The same KJT holding only lengths (drops cached offsets; kernels want one or the other)."""
        return self._derive(
            self._keys, self._values, self._weights, self.lengths(), self._stride,
            self._stride_per_key_per_rank, self._length_per_key, self._inverse_indices,
        )  # fmt: skip

    # ---------------------------------------------------------------- all-to-all of a KJT (torchrec's names)
    def dist_labels(self) -> List[str]:
        """Names of the tensors :meth:`dist_tensors` sends, in order."""
        return dist_labels(self.variable_stride_per_key(), self._weights is not None)

    def dist_splits(self, key_splits: List[int]) -> List[List[int]]:
        """Entries of each :meth:`dist_tensors` tensor that go to each destination, for keys split
        into consecutive groups of ``key_splits[r]`` keys (group ``r`` to rank ``r``)."""
        return dist_splits(
            self.stride_per_key(), self.length_per_key(), key_splits, self.variable_stride_per_key(),
            self._weights is not None,
        )  # fmt: skip

    def dist_tensors(self) -> List[torch.Tensor]:
        """The tensors an all-to-all sends: lengths, values, [per-key batch sizes], [weights]."""
        # only a variable-batch KJT sends (and so computes) its batch sizes
        stride_per_key = self.stride_per_key() if self.variable_stride_per_key() else None
        return dist_tensors(self.lengths(), self._values, self._weights, stride_per_key)

    @staticmethod
    def dist_init(
        keys: List[str],
        tensors: List[torch.Tensor],
        variable_stride_per_key: bool,
        num_workers: int,
        recat: Optional[torch.Tensor],
        stride_per_rank: Optional[List[int]],
        stagger: int = 1,
    ) -> "KeyedJaggedTensor":
        """The KJT a rank received: ``tensors`` as :meth:`dist_tensors` of each source rank laid end to end.

        ``recat`` (``[F * R]``) reorders the rank-major blocks key-major; ``stride_per_rank`` is each
        source rank's batch size, or ``None`` with ``variable_stride_per_key`` (see :mod:`kjt_dist`).
        """
        lengths, values, weights, stride, table = regroup_received(
            len(keys), tensors, variable_stride_per_key, num_workers, recat, stride_per_rank, stagger
        )
        return KeyedJaggedTensor._build(keys, values, weights, lengths, stride, table, None, None).sync()

    # ---------------------------------------------------------------- validation / printing
    @torch.jit.unused
    def validate(self) -> None:
        """Raise ``SparseValueError`` naming the first inconsistency of the layout.

        Unique keys, one length per (key, sample), int32/int64 ids and lengths, non-negative lengths
        counting every value once, offsets their running sum, one weight per value (:mod:`kjt_checks`).
        """
        validate_kjt_layout(
            self._keys, self._values, self._weights, self.lengths(), self._offsets, self._stride,
            self._stride_per_key_per_rank, self._inverse_indices,
        )  # fmt: skip

    @torch.jit.unused
    def __str__(self) -> str:
        return kjt_str(self.to_dict() if len(self._keys) > 0 else {})

    @torch.jit.unused
    def __repr__(self) -> str:
        return kjt_repr(self._keys, self.stride(), self._values.shape, self._weights is not None)


@torch.fx.wrap
def _kjt_concat(kjt_list: List[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """``KeyedJaggedTensor.concat`` (one ``torch.fx`` node: the loop needs real KJTs)."""
    if len(kjt_list) == 0:
        raise ValueError("KeyedJaggedTensor.concat needs at least one KeyedJaggedTensor")
    if len(kjt_list) == 1:
        return kjt_list[0]
    variable = kjt_list[0].variable_stride_per_key()
    weighted = kjt_list[0].weights_or_none() is not None
    stride = kjt_list[0].stride()
    strides_seen: List[int] = []  # only fixed-batch KJTs must agree on one batch size
    if not variable:
        strides_seen = [kjt.stride() for kjt in kjt_list]
    kjt_transforms.check_concat_inputs(
        [kjt.variable_stride_per_key() for kjt in kjt_list],
        strides_seen,
        [kjt.weights_or_none() is not None for kjt in kjt_list],
    )
    keys, length_per_key, strides = kjt_transforms.concat_key_lists(
        [kjt.keys() for kjt in kjt_list],
        [kjt.length_per_key() for kjt in kjt_list],
        [kjt.stride_per_key_per_rank() for kjt in kjt_list],
    )
    inverses: List[Optional[Tuple[List[str], torch.Tensor]]] = []  # typed: TorchScript warns on a comprehension
    for kjt in kjt_list:
        inverses.append(kjt.inverse_indices_or_none())
    inverse_indices = kjt_transforms.concat_inverse_indices(inverses)
    weights: Optional[torch.Tensor] = None
    if weighted:
        weights = torch.cat([kjt.weights() for kjt in kjt_list])
    values = torch.cat([kjt.values() for kjt in kjt_list])
    lengths = torch.cat([kjt.lengths() for kjt in kjt_list])
    return KeyedJaggedTensor._build(
        keys, values, weights, lengths, None if variable else stride, strides if variable else None,
        length_per_key, inverse_indices,
    )  # fmt: skip
