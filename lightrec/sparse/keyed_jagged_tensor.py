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
"""

from typing import Dict, List, Optional, Tuple

import torch

from lightrec.sparse._ops import complete_cumsum, permute_2d_sparse
from lightrec.sparse.jagged_tensor import (
    JaggedTensor,
    JaggedTensorMeta,
    SparseValueError,
    _check_lengths_offsets,
    _lengths_from_offsets,
    _raise,
    _values_repr,
)

__all__ = ["KeyedJaggedTensor"]


def _cumsum_list(xs: List[int]) -> List[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


class KeyedJaggedTensor(metaclass=JaggedTensorMeta):
    """Several jagged features (keys) over one batch, stored flat (see the module docstring).

    Args:
        keys: feature names, unique.
        values: ``[N]`` ids of every key and sample, key-major.
        weights: optional ``[N]`` per-id weights.
        lengths: ``[K * B]`` ids per (key, sample). Give ``lengths`` or ``offsets``.
        offsets: ``[K * B + 1]`` running sum of ``lengths``.
        stride: batch size ``B``; inferred as ``len(lengths) // len(keys)`` when omitted.
        length_per_key / offset_per_key / index_per_key: optional precomputed caches.
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
        length_per_key: Optional[List[int]] = None,
        offset_per_key: Optional[List[int]] = None,
        index_per_key: Optional[Dict[str, int]] = None,
        jt_dict: Optional[Dict[str, JaggedTensor]] = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("KeyedJaggedTensor needs lengths or offsets to know where each sample's ids start")
        self._keys: List[str] = keys
        self._values: torch.Tensor = values
        self._weights: Optional[torch.Tensor] = weights
        self._lengths: Optional[torch.Tensor] = lengths
        self._offsets: Optional[torch.Tensor] = offsets
        self._stride: Optional[int] = stride
        self._length_per_key: Optional[List[int]] = length_per_key
        self._offset_per_key: Optional[List[int]] = offset_per_key
        self._index_per_key: Optional[Dict[str, int]] = index_per_key
        self._jt_dict: Optional[Dict[str, JaggedTensor]] = jt_dict

    # ---------------------------------------------------------------- constructors
    @staticmethod
    def from_offsets_sync(
        keys: List[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
    ) -> "KeyedJaggedTensor":
        """Build from offsets and compute the per-key caches now (one host sync)."""
        kjt = KeyedJaggedTensor(keys=keys, values=values, weights=weights, offsets=offsets, stride=stride)
        return kjt.sync()

    @staticmethod
    def from_lengths_sync(
        keys: List[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
    ) -> "KeyedJaggedTensor":
        """Build from lengths and compute the per-key caches now (one host sync)."""
        kjt = KeyedJaggedTensor(keys=keys, values=values, weights=weights, lengths=lengths, stride=stride)
        return kjt.sync()

    @staticmethod
    def from_jt_dict(jt_dict: Dict[str, JaggedTensor]) -> "KeyedJaggedTensor":
        """Stack ``{key: JaggedTensor}`` (all with the same batch size) in the dict's key order.

        Either every JaggedTensor has weights or none does.
        """
        keys = list(jt_dict.keys())
        if len(keys) == 0:
            return KeyedJaggedTensor.empty()
        jts = [jt_dict[k] for k in keys]
        stride = jts[0].lengths().numel()
        for k, jt in zip(keys, jts):
            if jt.lengths().numel() != stride:
                _raise(
                    f"from_jt_dict: every feature needs the same batch size; '{keys[0]}' has {stride} samples "
                    f"but '{k}' has {jt.lengths().numel()}"
                )
        weighted = [jt.weights_or_none() is not None for jt in jts]
        if any(weighted) and not all(weighted):
            missing = [k for k, w in zip(keys, weighted) if not w]
            _raise(f"from_jt_dict: features {missing} have no weights while others do; weight all or none")
        weights: Optional[torch.Tensor] = None
        if all(weighted):
            weights = torch.cat([jt.weights() for jt in jts])
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([jt.values() for jt in jts]),
            weights=weights,
            lengths=torch.cat([jt.lengths() for jt in jts]),
            stride=stride,
            offsets=None,
            length_per_key=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        values_dtype: Optional[torch.dtype] = None,
        weights_dtype: Optional[torch.dtype] = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "KeyedJaggedTensor":
        """A KJT with no keys, no samples and no values."""
        weights = (
            torch.empty(0, dtype=weights_dtype if weights_dtype is not None else torch.float32, device=device)
            if is_weighted
            else None
        )
        return KeyedJaggedTensor(
            keys=[],
            values=torch.empty(0, dtype=values_dtype if values_dtype is not None else torch.int64, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            stride=0,
            offsets=None,
            length_per_key=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

    @staticmethod
    def empty_like(kjt: "KeyedJaggedTensor") -> "KeyedJaggedTensor":
        """A KJT with the keys and batch size of ``kjt`` and no ids."""
        w = kjt.weights_or_none()
        return KeyedJaggedTensor(
            keys=kjt.keys(),
            values=torch.empty(0, dtype=kjt.values().dtype, device=kjt.device()),
            weights=torch.empty(0, dtype=w.dtype, device=w.device) if w is not None else None,
            lengths=torch.zeros_like(kjt.lengths()),
            stride=kjt.stride(),
            offsets=None,
            length_per_key=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

    @staticmethod
    def concat(kjt_list: List["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Put the keys of several KJTs with the same batch size side by side."""
        if len(kjt_list) == 0:
            raise ValueError("KeyedJaggedTensor.concat needs at least one KeyedJaggedTensor")
        if len(kjt_list) == 1:
            return kjt_list[0]
        stride = kjt_list[0].stride()
        keys: List[str] = []
        length_per_key: List[int] = []
        weighted = kjt_list[0].weights_or_none() is not None
        for kjt in kjt_list:
            if kjt.stride() != stride:
                raise ValueError(
                    f"KeyedJaggedTensor.concat needs one batch size, got strides "
                    f"{[k.stride() for k in kjt_list]}"
                )
            if (kjt.weights_or_none() is not None) != weighted:
                raise ValueError("KeyedJaggedTensor.concat needs all inputs weighted or all unweighted")
            keys.extend(kjt.keys())
            length_per_key.extend(kjt.length_per_key())
        weights: Optional[torch.Tensor] = None
        if weighted:
            weights = torch.cat([kjt.weights() for kjt in kjt_list])
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([kjt.values() for kjt in kjt_list]),
            weights=weights,
            lengths=torch.cat([kjt.lengths() for kjt in kjt_list]),
            stride=stride,
            length_per_key=length_per_key,
            offsets=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

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
        lengths = self._lengths
        if lengths is None:
            offsets = self._offsets
            if offsets is None:
                raise ValueError("KeyedJaggedTensor has neither lengths nor offsets")
            lengths = _lengths_from_offsets(offsets)
            self._lengths = lengths
        return lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        offsets = self._offsets
        if offsets is None:
            lengths = self._lengths
            if lengths is None:
                raise ValueError("KeyedJaggedTensor has neither lengths nor offsets")
            offsets = complete_cumsum(lengths)
            self._offsets = offsets
        return offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def stride(self) -> int:
        """Batch size ``B`` (samples per key)."""
        stride = self._stride
        if stride is None:
            num_keys = len(self._keys)
            if num_keys == 0:
                stride = 0
            else:
                lengths = self._lengths
                n = lengths.numel() if lengths is not None else self.offsets().numel() - 1
                stride = n // num_keys
            self._stride = stride
        return stride

    def length_per_key(self) -> List[int]:
        """Number of ids of each key over the batch (host list; computing it syncs once)."""
        lpk = self._length_per_key
        if lpk is None:
            num_keys = len(self._keys)
            if num_keys == 0:
                lpk = []
            else:
                sums: List[int] = self.lengths().view(num_keys, -1).sum(dim=1).tolist()
                lpk = sums
            self._length_per_key = lpk
        return lpk

    def length_per_key_or_none(self) -> Optional[List[int]]:
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        """Start of each key's ids in ``values`` (``len(keys) + 1`` entries)."""
        opk = self._offset_per_key
        if opk is None:
            opk = _cumsum_list(self.length_per_key())
            self._offset_per_key = opk
        return opk

    def offset_per_key_or_none(self) -> Optional[List[int]]:
        return self._offset_per_key

    def index_per_key(self) -> Dict[str, int]:
        """``{key: position}``."""
        ipk = self._index_per_key
        if ipk is None:
            new_ipk: Dict[str, int] = {}
            for i, k in enumerate(self._keys):
                new_ipk[k] = i
            self._index_per_key = new_ipk
            ipk = new_ipk
        return ipk

    def lengths_offset_per_key(self) -> List[int]:
        """Start of each key's lengths in ``lengths()`` (multiples of the stride)."""
        stride = self.stride()
        return [i * stride for i in range(len(self._keys) + 1)]

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
        if sum(segments) != len(self._keys):
            raise ValueError(
                f"split(segments={segments}) must cover the {len(self._keys)} keys exactly, "
                f"but the segments sum to {sum(segments)}"
            )
        stride = self.stride()
        lpk = self.length_per_key()
        lengths = self.lengths()
        weights = self._weights
        out: List[KeyedJaggedTensor] = []
        key_start = 0
        value_start = 0
        for seg in segments:
            key_end = key_start + seg
            value_end = value_start + sum(lpk[key_start:key_end])
            out.append(
                KeyedJaggedTensor(
                    keys=self._keys[key_start:key_end],
                    values=self._values[value_start:value_end],
                    weights=weights[value_start:value_end] if weights is not None else None,
                    lengths=lengths[key_start * stride : key_end * stride],
                    stride=stride,
                    length_per_key=lpk[key_start:key_end],
                    offsets=None,
                    offset_per_key=None,
                    index_per_key=None,
                    jt_dict=None,
                )
            )
            key_start = key_end
            value_start = value_end
        return out

    def permute(
        self, indices: List[int], indices_tensor: Optional[torch.Tensor] = None
    ) -> "KeyedJaggedTensor":
        """New KJT whose key ``i`` is this KJT's key ``indices[i]`` (keys may repeat or be left out)."""
        num_keys = len(self._keys)
        for i in indices:
            if i < 0 or i >= num_keys:
                raise IndexError(f"permute: index {i} is out of range for {num_keys} keys {self._keys}")
        if indices_tensor is None:
            indices_tensor = torch.tensor(indices, dtype=torch.int32, device=self._values.device)
        stride = self.stride()
        lpk = self.length_per_key()
        lengths2d = self.lengths().view(num_keys, stride)
        # The output size from the host-side sizes: the kernel need not read it from the device.
        total = 0
        for i in indices:
            total += lpk[i]
        out_lengths, out_values, out_weights = permute_2d_sparse(
            indices_tensor, lengths2d, self._values, self._weights, total
        )
        return KeyedJaggedTensor(
            keys=[self._keys[i] for i in indices],
            values=out_values,
            weights=out_weights,
            lengths=out_lengths.view(-1),
            stride=stride,
            length_per_key=[lpk[i] for i in indices],
            offsets=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

    def permute_to_keys(self, keys: List[str]) -> "KeyedJaggedTensor":
        """This KJT with its keys in the order ``keys`` (itself when already so ordered).

        Raises ``KeyError`` naming the first key of ``keys`` that this KJT lacks.
        """
        if keys == self._keys:
            return self
        index = self.index_per_key()
        indices: List[int] = []
        for k in keys:
            if k not in index:
                raise KeyError("feature " + k + " is not in this KeyedJaggedTensor; its keys are " + ", ".join(self._keys))
            indices.append(index[k])
        return self.permute(indices, None)

    def to_dict(self) -> Dict[str, JaggedTensor]:
        """``{key: JaggedTensor}`` views of each feature (cached)."""
        jt_dict = self._jt_dict
        if jt_dict is not None:
            return jt_dict
        stride = self.stride()
        opk = self.offset_per_key()
        lengths = self.lengths()
        weights = self._weights
        new_dict: Dict[str, JaggedTensor] = {}
        for i, key in enumerate(self._keys):
            new_dict[key] = JaggedTensor(
                values=self._values[opk[i] : opk[i + 1]],
                weights=weights[opk[i] : opk[i + 1]] if weights is not None else None,
                lengths=lengths[i * stride : (i + 1) * stride],
                offsets=None,
            )
        self._jt_dict = new_dict
        return new_dict

    def __getitem__(self, key: str) -> JaggedTensor:
        index = self.index_per_key()
        if key not in index:
            raise KeyError(f"feature '{key}' is not in this KeyedJaggedTensor; its keys are {self._keys}")
        return self.to_dict()[key]

    def to(self, device: torch.device, non_blocking: bool = False) -> "KeyedJaggedTensor":
        """Copy every tensor to ``device``; host-side caches are kept (no sync)."""
        weights = self._weights
        lengths = self._lengths
        offsets = self._offsets
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values.to(device, non_blocking=non_blocking),
            weights=weights.to(device, non_blocking=non_blocking) if weights is not None else None,
            lengths=lengths.to(device, non_blocking=non_blocking) if lengths is not None else None,
            offsets=offsets.to(device, non_blocking=non_blocking) if offsets is not None else None,
            stride=self._stride,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            jt_dict=None,
        )

    @torch.jit.unused
    def pin_memory(self) -> "KeyedJaggedTensor":
        """Copy into page-locked host memory so a later ``to(cuda, non_blocking=True)`` is async."""
        weights = self._weights
        lengths = self._lengths
        offsets = self._offsets
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values.pin_memory(),
            weights=weights.pin_memory() if weights is not None else None,
            lengths=lengths.pin_memory() if lengths is not None else None,
            offsets=offsets.pin_memory() if offsets is not None else None,
            stride=self._stride,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            jt_dict=None,
        )

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (CUDA caching-allocator safety)."""
        for t in (self._values, self._weights, self._lengths, self._offsets):
            if t is not None:
                t.record_stream(stream)

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """The same KJT holding only lengths (drops cached offsets; kernels want one or the other)."""
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values,
            weights=self._weights,
            lengths=self.lengths(),
            stride=self._stride,
            length_per_key=self._length_per_key,
            offsets=None,
            offset_per_key=None,
            index_per_key=None,
            jt_dict=None,
        )

    # ---------------------------------------------------------------- validation / printing
    @torch.jit.unused
    def validate(self) -> None:
        """Raise ``SparseValueError`` when the layout is inconsistent.

        Checks: unique keys; ``len(lengths)`` divisible by the number of keys (and equal to
        ``len(keys) * stride`` when a stride was given); ids (``values``) and lengths int32 or
        int64 (float or uint8 ids are refused, not cast); lengths non-negative (naming the
        feature) and summing to ``len(values)`` (surplus values are named, never dropped);
        offsets equal to the running sum of lengths; one weight per value.
        """
        _validate_kjt(self)

    @torch.jit.unused
    def __str__(self) -> str:
        if len(self._keys) == 0:
            return "KeyedJaggedTensor()\n"
        lines: List[str] = []
        for key, jt in self.to_dict().items():
            dense = list(jt.to_dense())
            dw = jt.to_dense_weights()
            if dw is None:
                lines.append(f'    "{key}": {_values_repr(dense)}')
            else:
                lines.append(
                    f'    "{key}": {{\n        "values": {_values_repr(dense)},\n'
                    f'        "weights": {_values_repr(list(dw))}\n    }}'
                )
        return "KeyedJaggedTensor({\n" + ",\n".join(lines) + "\n})\n"

    @torch.jit.unused
    def __repr__(self) -> str:
        return (
            f"KeyedJaggedTensor(keys={self._keys}, stride={self.stride()}, "
            f"values={tuple(self._values.shape)}, weighted={self._weights is not None})"
        )


@torch.jit.unused
def _validate_kjt(kjt: KeyedJaggedTensor) -> None:
    keys = kjt.keys()
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise SparseValueError(f"KeyedJaggedTensor keys must be unique; duplicated: {dupes}")
    lengths = kjt.lengths()
    if len(keys) == 0:
        if lengths.numel() != 0 or kjt.values().numel() != 0:
            raise SparseValueError(
                f"KeyedJaggedTensor has no keys but {lengths.numel()} lengths and {kjt.values().numel()} values"
            )
        return
    if lengths.numel() % len(keys) != 0:
        raise SparseValueError(
            f"KeyedJaggedTensor has {lengths.numel()} lengths, not divisible by its {len(keys)} keys {keys}; "
            "lengths must hold batch_size entries per key"
        )
    if kjt._stride is not None and kjt._stride * len(keys) != lengths.numel():
        raise SparseValueError(
            f"KeyedJaggedTensor stride={kjt._stride} with {len(keys)} keys needs {kjt._stride * len(keys)} "
            f"lengths, got {lengths.numel()}"
        )
    _check_id_dtypes(kjt.values(), lengths, keys)
    _check_per_feature_counts(kjt.values(), lengths, keys)
    _check_lengths_offsets(kjt.values(), kjt.weights_or_none(), lengths, kjt.offsets_or_none(), "KeyedJaggedTensor")


_ID_DTYPES = (torch.int32, torch.int64)


def _check_id_dtypes(values: torch.Tensor, lengths: torch.Tensor, keys: List[str]) -> None:
    """Ids and lengths are int32/int64: what every lookup kernel indexes with (no silent casts)."""
    for name, tensor in (("values (the ids)", values), ("lengths", lengths)):
        if tensor.dtype not in _ID_DTYPES:
            raise SparseValueError(
                f"KeyedJaggedTensor {name} of features {keys} must be int64 or int32, got {tensor.dtype}; "
                f"convert them with .long() (ids must be whole numbers: a float id is not an embedding row)"
            )


def _check_per_feature_counts(values: torch.Tensor, lengths: torch.Tensor, keys: List[str]) -> None:
    """Name the feature whose lengths are negative, and say where values beyond the lengths start."""
    per_key = lengths.reshape(len(keys), -1)
    if lengths.numel() > 0 and bool((per_key < 0).any()):
        k = int(torch.nonzero((per_key < 0).any(dim=1))[0, 0])
        raise SparseValueError(
            f"KeyedJaggedTensor feature {keys[k]!r} has a negative length (lengths must be non-negative: every sample needs a count >= 0 of ids)"
        )
    total = int(lengths.sum()) if lengths.numel() > 0 else 0
    if total < values.size(0):
        raise SparseValueError(
            f"KeyedJaggedTensor has {values.size(0) - total} values beyond the last feature {keys[-1]!r}: lengths "
            f"sum to {total} but values has {values.size(0)} entries, so the surplus ids would be dropped "
            "silently; lengths must count every value exactly once"
        )


def _kjt_flatten(kjt: KeyedJaggedTensor) -> Tuple[List[Optional[torch.Tensor]], List[str]]:
    return [kjt.values(), kjt.weights_or_none(), kjt.lengths()], kjt.keys()


def _kjt_unflatten(tensors: List[Optional[torch.Tensor]], keys: List[str]) -> KeyedJaggedTensor:
    values, weights, lengths = tensors
    return KeyedJaggedTensor(keys=keys, values=values, weights=weights, lengths=lengths)  # type: ignore[arg-type]


# Register with pytree so torch.compile / torch.export / DataLoader pin_memory see through KJTs.
torch.utils._pytree.register_pytree_node(
    KeyedJaggedTensor,
    lambda kjt: _kjt_flatten(kjt),
    lambda tensors, keys: _kjt_unflatten(list(tensors), keys),
    serialized_type_name="lightrec.KeyedJaggedTensor",
)

__all__ += ["SparseValueError"]
