"""``JaggedTensor``: one sparse feature for a batch — a variable number of values per sample.

Layout (batch of 3 samples; sample 1 has no ids)::

    sample   |  0        |  1  |  2
    ---------+-----------+-----+------------
    values   |  5, 7     |     |  1, 3, 9       values  = [5, 7, 1, 3, 9]   shape [N] (or [N, D])
    lengths  |  2        |  0  |  3             lengths = [2, 0, 3]         shape [B]
    offsets  |  0        |  2  |  2   (5)       offsets = [0, 2, 2, 5]      shape [B + 1]

``weights`` (optional) has the shape of ``values`` and holds one score per id (weighted features).

The sparse types are written in the subset of Python that ``torch.jit.script`` compiles (hence
``typing.List``/``Optional`` annotations) and use ``torch.fx.ProxyableClassMeta`` so that building
them inside a traced module records a node instead of failing on proxies.
"""

from typing import Any, Dict, List, Optional

import torch
from torch.fx import ProxyableClassMeta

from lightrec._compat import proxyable_call
from lightrec.sparse._ops import complete_cumsum
from lightrec.sparse.kjt_device import copy_into, num_bytes

__all__ = ["JaggedTensor", "JaggedTensorMeta", "SparseValueError"]


class SparseValueError(ValueError):
    """Inconsistent jagged input: lengths, offsets, values and weights that do not fit together."""


class JaggedTensorMeta(ProxyableClassMeta):
    """Metaclass of the sparse types.

    Under ``torch.fx`` tracing a constructor call with proxy arguments becomes one graph node
    (``ProxyableClassMeta``). In eager mode it also accepts the Python lists that tutorials pass
    (``lengths=[2, 3, 1]``) by turning them into tensors before ``__init__`` sees them; TorchScript
    never goes through a metaclass, so the scripted ``__init__`` keeps strict tensor types.
    ``validate=True`` is handled here too (TorchScript constructors take no defaulted flags), so
    eager construction can check its input while scripted inference code stays check-free.
    Construction goes through :func:`lightrec._compat.proxyable_call`, which asks torch whether fx is
    tracing with the non-deprecated ``is_fx_symbolic_tracing`` (``ProxyableClassMeta`` itself calls
    the deprecated ``is_fx_tracing``, which logs a warning in every process).
    """

    def __call__(cls, *args: Any, validate: bool = False, **kwargs: Any) -> Any:
        for name in ("values", "weights", "lengths", "offsets"):
            value = kwargs.get(name)
            if isinstance(value, (list, tuple)):
                dtype = torch.float32 if name == "weights" else None
                if name in ("lengths", "offsets") and len(value) == 0:
                    dtype = torch.int64  # torch.tensor([]) would be float32
                kwargs[name] = torch.tensor(value, dtype=dtype)
        # torchrec also takes the per-key, per-rank batch sizes of a variable-batch KJT as an
        # [F, R] int tensor; the scripted class keeps one type, the host list.
        strides = kwargs.get("stride_per_key_per_rank")
        if isinstance(strides, torch.Tensor):
            kwargs["stride_per_key_per_rank"] = strides.tolist()
        instance = proxyable_call(cls, args, kwargs)
        if validate:
            instance.validate()
        return instance


def _values_repr(values: List[torch.Tensor]) -> str:
    return "[" + ", ".join(str(v.tolist()) for v in values) + "]"


@torch.jit.unused
def _raise(message: str) -> None:
    raise SparseValueError(message)


def _check_lengths_offsets(
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    lengths: torch.Tensor,
    offsets: Optional[torch.Tensor],
    where: str,
) -> None:
    """Validate one jagged layout; raises ``SparseValueError`` naming ``where``."""
    check_same_device(values, {"weights": weights, "lengths": lengths, "offsets": offsets}, where)
    check_offsets_start(offsets, where)
    if lengths.dim() != 1:
        _raise(f"{where}: lengths must be 1-D, got shape {list(lengths.shape)}")
    if lengths.is_floating_point():
        _raise(f"{where}: lengths must be an integer tensor, got dtype {lengths.dtype}")
    if lengths.numel() > 0 and bool((lengths < 0).any()):
        bad = int(torch.nonzero(lengths < 0)[0, 0])
        _raise(
            f"{where}: lengths must be non-negative, got lengths[{bad}] = {int(lengths[bad])}; "
            "every sample needs a count >= 0 of ids"
        )
    total = int(lengths.sum()) if lengths.numel() > 0 else 0
    if total != values.size(0):
        _raise(
            f"{where}: lengths sum to {total} but values has {values.size(0)} entries; "
            "lengths must count every value exactly once"
        )
    if offsets is not None and not (offsets.numel() == 0 and lengths.numel() == 0):  # [] is empty's offsets
        if offsets.numel() != lengths.numel() + 1:
            _raise(
                f"{where}: offsets must have len(lengths) + 1 = {lengths.numel() + 1} entries, "
                f"got {offsets.numel()}"
            )
        elif not torch.equal(offsets.long(), complete_cumsum(lengths.long())):
            _raise(f"{where}: offsets {offsets.tolist()} are not the running sum of lengths {lengths.tolist()}")
    if weights is not None and weights.size(0) != values.size(0):
        _raise(
            f"{where}: weights has {weights.size(0)} entries but values has {values.size(0)}; "
            "pass one weight per value (or weights=None)"
        )


@torch.jit.unused
def check_same_device(values: torch.Tensor, others: Dict[str, Optional[torch.Tensor]], where: str) -> None:
    """Every tensor of ``others`` (named) is on ``values``' device; raises ``SparseValueError`` naming
    the first one that is not (the kernels would fail later with a message that names neither)."""
    for name, tensor in others.items():
        if tensor is not None and tensor.device != values.device:
            _raise(
                f"{where}: {name} is on {tensor.device} but values is on {values.device}; every tensor of the "
                "batch must be on one device: build them there, or move the whole batch with .to(device)"
            )


def check_offsets_start(offsets: Optional[torch.Tensor], where: str) -> None:
    """Offsets start at 0 (torchrec's validator's rule); raises ``SparseValueError`` naming ``where``.

    Checked before the sums: offsets ``[2, 4, 5]`` would otherwise read as lengths that miss values.
    """
    if offsets is not None and offsets.dim() == 1 and offsets.numel() > 0:
        first = int(offsets[0])
        if first != 0:
            _raise(
                f"{where}: offsets must start at 0, got offsets[0] = {first}; offsets[i] is where sample i's "
                "values start in values (slice values first if they begin later)"
            )


def _lengths_from_offsets(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def lengths_or_derive(lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor], owner: str) -> torch.Tensor:
    """``lengths``, or derived from ``offsets`` (what the jagged types' ``lengths()`` cache)."""
    if lengths is not None:
        return lengths
    if offsets is None:
        raise ValueError(owner + " has neither lengths nor offsets")
    return _lengths_from_offsets(offsets)


def offsets_or_derive(lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor], owner: str) -> torch.Tensor:
    """``offsets``, or the running sum of ``lengths`` (what the jagged types' ``offsets()`` cache)."""
    if offsets is not None:
        return offsets
    if lengths is None:
        raise ValueError(owner + " has neither lengths nor offsets")
    return complete_cumsum(lengths)


class JaggedTensor(metaclass=JaggedTensorMeta):
    """A batch of variable-length rows for one feature (see the module docstring for the layout).

    Args:
        values: ``[N]`` ids (or ``[N, D]`` embeddings for an unpooled lookup result).
        weights: optional ``[N]`` per-value weights.
        lengths: ``[B]`` values per sample. Give ``lengths`` or ``offsets`` (or both).
        offsets: ``[B + 1]`` start of each sample's values, ending with ``N``.
        validate: check that lengths, offsets, values and weights agree (costs a device sync).
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        lengths: Optional[torch.Tensor] = None,
        offsets: Optional[torch.Tensor] = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("JaggedTensor needs lengths or offsets to know where each sample's values start")
        self._values: torch.Tensor = values
        self._weights: Optional[torch.Tensor] = weights
        self._lengths: Optional[torch.Tensor] = lengths
        self._offsets: Optional[torch.Tensor] = offsets

    # ---------------------------------------------------------------- constructors
    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        values_dtype: Optional[torch.dtype] = None,
        weights_dtype: Optional[torch.dtype] = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "JaggedTensor":
        """A JaggedTensor with no samples and no values.

        Like torchrec, ``offsets()`` is empty (``[]``), not ``[0]``: no sample, no boundary.
        """
        weights = (
            torch.empty(0, dtype=weights_dtype if weights_dtype is not None else torch.float32, device=device)
            if is_weighted
            else None
        )
        return JaggedTensor(
            values=torch.empty(0, dtype=values_dtype if values_dtype is not None else torch.int64, device=device),
            weights=weights,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            offsets=torch.empty(0, dtype=lengths_dtype, device=device),
        )

    @staticmethod
    def empty_like(jt: "JaggedTensor", device: Optional[torch.device] = None) -> "JaggedTensor":
        """A JaggedTensor with ``jt``'s dtypes: no samples on ``jt``'s device, or, with ``device``,
        uninitialised tensors of ``jt``'s shapes there (torchrec's device-copy form)."""
        weights = jt.weights_or_none()
        if device is None:
            return JaggedTensor(
                values=torch.empty(0, dtype=jt.values().dtype, device=jt.device()),
                weights=torch.empty(0, dtype=weights.dtype, device=jt.device()) if weights is not None else None,
                lengths=torch.empty(0, dtype=jt.lengths().dtype, device=jt.device()),
                offsets=None,
            )
        lengths = jt.lengths_or_none()
        offsets = jt.offsets_or_none()
        return JaggedTensor(
            values=torch.empty_like(jt.values(), device=device),
            weights=torch.empty_like(weights, device=device) if weights is not None else None,
            lengths=torch.empty_like(lengths, device=device) if lengths is not None else None,
            offsets=torch.empty_like(offsets, device=device) if offsets is not None else None,
        )

    @staticmethod
    def from_dense_lengths(
        values: torch.Tensor, lengths: torch.Tensor, weights: Optional[torch.Tensor] = None
    ) -> "JaggedTensor":
        """Keep the first ``lengths[b]`` entries of each padded row ``values[b]``.

        Args:
            values: ``[B, L]`` (or ``[B, L, D]``) padded rows.
            lengths: ``[B]`` valid entries per row, each ``<= L``.
            weights: optional ``[B, L]`` padded weights.
        """
        mask = torch.arange(values.size(1), device=values.device).unsqueeze(0) < lengths.unsqueeze(1)
        return JaggedTensor(
            values=values[mask],
            weights=weights[mask] if weights is not None else None,
            lengths=lengths,
            offsets=None,
        )

    @staticmethod
    def from_dense(values: List[torch.Tensor], weights: Optional[List[torch.Tensor]] = None) -> "JaggedTensor":
        """Concatenate one tensor per sample (``values[b]`` is ``[len_b]`` or ``[len_b, D]``)."""
        lengths = torch.tensor([v.size(0) for v in values], dtype=torch.int32)
        if len(values) == 0:
            return JaggedTensor.empty(is_weighted=weights is not None)
        lengths = lengths.to(values[0].device)
        return JaggedTensor(
            values=torch.cat(values),
            weights=torch.cat(weights) if weights is not None else None,
            lengths=lengths,
            offsets=None,
        )

    # ---------------------------------------------------------------- accessors
    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        w = self._weights
        if w is None:
            raise ValueError("this JaggedTensor has no weights; check weights_or_none() first")
        return w

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        lengths = lengths_or_derive(self._lengths, self._offsets, "JaggedTensor")
        self._lengths = lengths
        return lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        offsets = offsets_or_derive(self._lengths, self._offsets, "JaggedTensor")
        self._offsets = offsets
        return offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    # ---------------------------------------------------------------- transforms
    def to_dense(self) -> List[torch.Tensor]:
        """One tensor per sample: ``[values[o_b:o_{b+1}] for b in range(B)]`` (views; one host read).

        Offsets, when the JaggedTensor has them, are read as given (as torchrec does: rows of offsets
        ``[2, 4, 5]`` are ``values[2:4]`` and ``values[4:5]``).
        """
        return _dense_rows(self._values, self._lengths, self._offsets)

    def to_dense_weights(self) -> Optional[List[torch.Tensor]]:
        w = self._weights
        if w is None:
            return None
        return _dense_rows(w, self._lengths, self._offsets)

    def to_padded_dense(self, desired_length: Optional[int] = None, padding_value: float = 0.0) -> torch.Tensor:
        """``[B, L]`` (or ``[B, L, D]``) rows padded with ``padding_value``, truncated to ``desired_length``.

        ``L`` defaults to the longest sample. Rows start at the offsets when there are any (torchrec).
        """
        return _to_padded(self._values, self.lengths(), self._offsets, desired_length, padding_value)

    def to_padded_dense_weights(
        self, desired_length: Optional[int] = None, padding_value: float = 0.0
    ) -> Optional[torch.Tensor]:
        w = self._weights
        if w is None:
            return None
        return _to_padded(w, self.lengths(), self._offsets, desired_length, padding_value)

    def to(self, device: torch.device, non_blocking: bool = False) -> "JaggedTensor":
        """Copy to ``device`` (values, weights, lengths and offsets that exist)."""
        weights = self._weights
        lengths = self._lengths
        offsets = self._offsets
        return JaggedTensor(
            values=self._values.to(device, non_blocking=non_blocking),
            weights=weights.to(device, non_blocking=non_blocking) if weights is not None else None,
            lengths=lengths.to(device, non_blocking=non_blocking) if lengths is not None else None,
            offsets=offsets.to(device, non_blocking=non_blocking) if offsets is not None else None,
        )

    def copy_(self, jt: "JaggedTensor", non_blocking: bool = False) -> "JaggedTensor":
        """Copy ``jt``'s tensors into this one's, in place (torchrec's; e.g. into ``empty_like(jt, device)``).

        The tensors must have ``jt``'s shapes; a tensor only one side has is left as it is.
        """
        self._values.copy_(jt._values, non_blocking=non_blocking)
        copy_into(self._weights, jt._weights, non_blocking)
        copy_into(self._lengths, jt._lengths, non_blocking)
        copy_into(self._offsets, jt._offsets, non_blocking)
        return self

    def size_in_bytes(self) -> int:
        """Bytes of the tensors this JaggedTensor holds (values, weights, lengths, offsets that exist)."""
        return num_bytes([self._values, self._weights, self._lengths, self._offsets])

    @torch.jit.unused
    def pin_memory(self) -> "JaggedTensor":
        weights = self._weights
        lengths = self._lengths
        offsets = self._offsets
        return JaggedTensor(
            values=self._values.pin_memory(),
            weights=weights.pin_memory() if weights is not None else None,
            lengths=lengths.pin_memory() if lengths is not None else None,
            offsets=offsets.pin_memory() if offsets is not None else None,
        )

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (CUDA caching-allocator safety)."""
        for t in (self._values, self._weights, self._lengths, self._offsets):
            if t is not None:
                t.record_stream(stream)

    @torch.jit.unused
    def validate(self) -> None:
        """Raise ``SparseValueError`` if lengths/offsets/values/weights are inconsistent."""
        _check_lengths_offsets(self._values, self._weights, self.lengths(), self._offsets, "JaggedTensor")

    @torch.jit.unused
    def to_dict(self) -> Dict[str, List[torch.Tensor]]:
        out: Dict[str, List[torch.Tensor]] = {"values": list(self.to_dense())}
        dw = self.to_dense_weights()
        if dw is not None:
            out["weights"] = list(dw)
        return out

    @torch.jit.unused
    def __repr__(self) -> str:
        # Python's default form, under the public import path (as torchrec prints
        # "<torchrec.sparse.jagged_tensor.JaggedTensor object at 0x...>"), not this file's name.
        return f"<lightrec.sparse.jagged_tensor.JaggedTensor object at {hex(id(self))}>"

    @torch.jit.unused
    def __str__(self) -> str:
        body = _values_repr(list(self.to_dense()))
        dw = self.to_dense_weights()
        if dw is None:
            return "JaggedTensor({\n    " + body + "\n})\n"
        return (
            "JaggedTensor({\n    \"values\": " + body + ",\n    \"weights\": " + _values_repr(list(dw)) + "\n})\n"
        )


def _dense_rows(
    values: torch.Tensor, lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor]
) -> List[torch.Tensor]:
    """``values`` cut into one view per sample, by ``offsets`` when given, else by ``lengths`` from 0."""
    if offsets is None:
        sizes: List[int] = lengths_or_derive(lengths, offsets, "JaggedTensor").tolist()
        return list(torch.split(values, sizes))
    bounds: List[int] = offsets.tolist()
    if len(bounds) < 2:
        return []
    sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    return list(torch.split(values.narrow(0, bounds[0], bounds[-1] - bounds[0]), sizes))


def _to_padded(
    values: torch.Tensor,
    lengths: torch.Tensor,
    offsets: Optional[torch.Tensor],
    desired_length: Optional[int],
    padding_value: float,
) -> torch.Tensor:
    """``[B, L, ...]``: entry ``[b, c]`` is ``values[start_b + c]`` for ``c < lengths[b]``, else ``padding_value``.

    ``start_b`` is ``offsets[b]`` when given (rows need not start at 0, as in torchrec), else the
    running sum of ``lengths``. A gather: no host read beyond ``max(lengths)`` when ``L`` is not given.
    """
    batch = lengths.numel()
    length = desired_length if desired_length is not None else (int(lengths.max()) if batch > 0 else 0)
    shape = [batch, length] + list(values.shape[1:])
    if batch == 0 or length == 0 or values.size(0) == 0:
        return torch.full(shape, padding_value, dtype=values.dtype, device=values.device)
    lengths64 = lengths.long()
    starts = offsets[:-1].long() if offsets is not None else complete_cumsum(lengths64)[:-1]
    cols = torch.arange(length, device=values.device).unsqueeze(0)  # [1, L]
    keep = cols < lengths64.unsqueeze(1)  # [B, L]
    index = torch.where(keep, starts.unsqueeze(1) + cols, torch.zeros_like(cols))
    rows = values.index_select(0, index.reshape(-1)).view(shape)
    return rows.masked_fill(torch.logical_not(keep).view([batch, length] + [1] * (values.dim() - 1)), padding_value)
