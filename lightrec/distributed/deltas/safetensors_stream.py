"""A safetensors file as a list of byte views of the tensors themselves: written without a copy.

``safetensors.torch.save`` builds the whole file as one ``bytes`` object (a copy of every tensor),
which the writer then copies again into the page cache. A publish of a million 64-wide fp32 rows
is 330 MB; the first copy was a quarter of its write time. :func:`safetensors_parts` instead
returns the file as ``[header, tensor 1's bytes, tensor 2's bytes, ...]``, views of the tensors'
own storage, which ``os.write`` and ``hashlib`` read directly.

The layout is safetensors' own (any safetensors reader loads it)::

    8 bytes      N, the header's length, unsigned little-endian
    N bytes      JSON {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...},
                 padded with spaces so the data starts 8-byte aligned
    data         the tensors' bytes back to back (little-endian), offsets relative to the data's start

Tensors are laid out as safetensors lays them out (by dtype, widest first, then by name), so every
tensor's data stays aligned to its element size and the bytes equal ``safetensors.torch.save``'s.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping

import torch

__all__ = ["SAFETENSORS_DTYPES", "safetensors_parts"]

# In the order of safetensors' own dtype enum: it lays tensors out by that order, last first, then
# by name -- so the files here are byte-identical to ``safetensors.torch.save``'s (tested).
SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64",
}  # fmt: skip
_ORDER = {dtype: rank for rank, dtype in enumerate(SAFETENSORS_DTYPES)}


def safetensors_parts(tensors: Mapping[str, torch.Tensor]) -> list[memoryview]:
    """The safetensors file of ``tensors`` as byte views, in file order (their concatenation is the file).

    Args:
        tensors: ``{name: tensor}``; CPU tensors are viewed in place when contiguous (keep them
            unchanged until the views are written), others are copied to contiguous CPU memory.

    Raises:
        ValueError: a dtype safetensors has no name for.
    """
    if sys.byteorder != "little":  # safetensors stores little-endian; the views are the machine's bytes
        raise ValueError("safetensors_parts writes the machine's bytes and needs a little-endian machine")
    unknown = [(n, t.dtype) for n, t in tensors.items() if t.dtype not in _ORDER]
    if unknown:
        name, dtype = unknown[0]
        raise ValueError(f"tensor {name!r} has dtype {dtype}, which safetensors cannot store")
    ordered = sorted(tensors.items(), key=lambda item: (-_ORDER[item[1].dtype], item[0]))
    header: dict[str, dict[str, object]] = {}
    views: list[memoryview] = []
    offset = 0
    for name, tensor in ordered:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
        view = raw.numpy().data.cast("B")
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + view.nbytes]}  # fmt: skip
        offset += view.nbytes
        views.append(view)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return [memoryview(struct.pack("<Q", len(text)) + text), *views]
