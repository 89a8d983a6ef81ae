"""``KeyedTensor``: dense per-key blocks side by side, e.g. the pooled output of an EBC.

Layout (``key_dim=1``; keys ``product`` (D=64) and ``user`` (D=64), batch of 2)::

    values: [B, 128]
              | product: cols 0..63 | user: cols 64..127 |
    sample 0  |  ...                |  ...               |
    sample 1  |  ...                |  ...               |

    length_per_key = [64, 64]   offset_per_key = [0, 64, 128]
"""

from typing import Dict, List, Optional

import torch

from lightrec.sparse.jagged import JaggedTensorMeta, SparseValueError

__all__ = ["KeyedTensor"]


@torch.jit.unused
def _raise(message: str) -> None:
    raise SparseValueError(message)


def _cumsum(xs: List[int]) -> List[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


class KeyedTensor(metaclass=JaggedTensorMeta):
    """Named column blocks of one dense tensor.

    Args:
        keys: block names, in order.
        length_per_key: width of each block along ``key_dim``.
        values: the tensor, e.g. ``[B, sum(length_per_key)]`` for ``key_dim=1``.
        key_dim: dimension along which the blocks are laid out.
    """

    def __init__(
        self,
        keys: List[str],
        length_per_key: List[int],
        values: torch.Tensor,
        key_dim: int = 1,
        offset_per_key: Optional[List[int]] = None,
        index_per_key: Optional[Dict[str, int]] = None,
    ) -> None:
        if len(keys) != len(length_per_key):
            raise ValueError(
                "KeyedTensor needs one length per key, got " + str(len(keys)) + " keys and "
                + str(len(length_per_key)) + " lengths"
            )
        if key_dim >= values.dim() or sum(length_per_key) != values.size(key_dim):
            _raise(
                "KeyedTensor length_per_key " + str(length_per_key) + " of keys " + str(keys) + " sums to "
                + str(sum(length_per_key)) + " but values has shape " + str(list(values.shape)) + " (key_dim="
                + str(key_dim) + "): the widths of the keys' blocks must add up to values.size(key_dim); give "
                "each key the width of its block"
            )
        self._keys: List[str] = keys
        self._length_per_key: List[int] = length_per_key
        self._values: torch.Tensor = values
        self._key_dim: int = key_dim
        self._offset_per_key: Optional[List[int]] = offset_per_key
        self._index_per_key: Optional[Dict[str, int]] = index_per_key

    @staticmethod
    def from_tensor_list(
        keys: List[str], tensors: List[torch.Tensor], key_dim: int = 1, cat_dim: int = 1
    ) -> "KeyedTensor":
        """Concatenate one tensor per key along ``cat_dim``."""
        length_per_key = [t.shape[key_dim] for t in tensors]
        return KeyedTensor(keys=keys, length_per_key=length_per_key, values=torch.cat(tensors, dim=cat_dim),
                           key_dim=key_dim)

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def device(self) -> torch.device:
        return self._values.device

    def length_per_key(self) -> List[int]:
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        opk = self._offset_per_key
        if opk is None:
            opk = _cumsum(self._length_per_key)
            self._offset_per_key = opk
        return opk

    def index_per_key(self) -> Dict[str, int]:
        ipk = self._index_per_key
        if ipk is None:
            new_ipk: Dict[str, int] = {}
            for i, k in enumerate(self._keys):
                new_ipk[k] = i
            self._index_per_key = new_ipk
            ipk = new_ipk
        return ipk

    def _key_indices(self) -> Dict[str, int]:
        """``index_per_key()`` under torchrec's private name."""
        return self.index_per_key()

    def size_in_bytes(self) -> int:
        """Bytes of ``values``."""
        return self._values.element_size() * self._values.numel()

    def __getitem__(self, key: str) -> torch.Tensor:
        ipk = self.index_per_key()
        if key not in ipk:
            raise KeyError("key " + key + " is not in this KeyedTensor; its keys are " + ", ".join(self._keys))
        index = ipk[key]
        start = self.offset_per_key()[index]
        return self._values.narrow(self._key_dim, start, self._length_per_key[index])

    def to_dict(self) -> Dict[str, torch.Tensor]:
        """``{key: block}`` views into ``values``."""
        blocks = torch.split(self._values, self._length_per_key, dim=self._key_dim)
        out: Dict[str, torch.Tensor] = {}
        for k, block in zip(self._keys, blocks):
            out[k] = block
        return out

    @staticmethod
    def regroup(keyed_tensors: List["KeyedTensor"], groups: List[List[str]]) -> List[torch.Tensor]:
        """One tensor per group: the blocks named in ``groups[i]``, concatenated in that order.

        Used to feed interaction layers that want a different grouping of features than the
        embedding collections produced (e.g. user features vs item features). One ``torch.fx``
        node when traced (the key lookups need real KeyedTensors).
        """
        return _regroup_keyed_tensors(keyed_tensors, groups)

    @staticmethod
    def regroup_as_dict(
        keyed_tensors: List["KeyedTensor"], groups: List[List[str]], keys: List[str]
    ) -> Dict[str, torch.Tensor]:
        """``regroup`` with a name for each group."""
        if len(groups) != len(keys):
            raise ValueError(
                "regroup_as_dict needs one name per group, got " + str(len(groups)) + " groups and "
                + str(len(keys)) + " names"
            )
        tensors = KeyedTensor.regroup(keyed_tensors, groups)
        out: Dict[str, torch.Tensor] = {}
        for k, t in zip(keys, tensors):
            out[k] = t
        return out

    def to(self, device: torch.device, non_blocking: bool = False) -> "KeyedTensor":
        return KeyedTensor(
            keys=self._keys,
            length_per_key=self._length_per_key,
            values=self._values.to(device, non_blocking=non_blocking),
            key_dim=self._key_dim,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
        )

    @torch.jit.unused
    def pin_memory(self) -> "KeyedTensor":
        return KeyedTensor(
            self._keys, self._length_per_key, self._values.pin_memory(), self._key_dim, self._offset_per_key,
            self._index_per_key,
        )  # fmt: skip

    @torch.jit.unused
    def record_stream(self, stream: torch.Stream) -> None:
        self._values.record_stream(stream)

    @torch.jit.unused
    def __str__(self) -> str:
        if len(self._keys) == 0:
            return "KeyedTensor()\n"
        lines = [f'    "{k}": {v.tolist()}' for k, v in self.to_dict().items()]
        return "KeyedTensor({\n" + ",\n".join(lines) + "\n})\n"

    @torch.jit.unused
    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, length_per_key={self._length_per_key}, values={tuple(self._values.shape)})"


@torch.fx.wrap
def _regroup_keyed_tensors(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> List[torch.Tensor]:
    """``KeyedTensor.regroup`` (one ``torch.fx`` node): one ``cat`` of every group's blocks, split by group.

    As torchrec: the blocks are laid out along the first input's ``key_dim``, a key held by several
    inputs is read from the last of them, and an empty group gives an empty (width 0) tensor.
    """
    blocks: Dict[str, torch.Tensor] = {}
    key_dim = keyed_tensors[0].key_dim() if len(keyed_tensors) > 0 else 1
    for kt in keyed_tensors:
        for k, v in kt.to_dict().items():
            blocks[k] = v
    parts: List[torch.Tensor] = []
    widths: List[int] = []
    for group in groups:
        width = 0
        for k in group:
            if k not in blocks:
                raise KeyError("regroup: key " + k + " is in no KeyedTensor")
            block = blocks[k]
            parts.append(block)
            width += block.size(key_dim)
        widths.append(width)
    if len(parts) == 0:  # only empty groups: width-0 slices of the first input
        empty = keyed_tensors[0].values().narrow(key_dim, 0, 0)
        return [empty for _ in groups]
    return list(torch.cat(parts, dim=key_dim).split(widths, dim=key_dim))
