"""The streamed safetensors file: the same bytes ``safetensors.torch.save`` writes, from views of the tensors."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from lightrec.distributed.deltas.safetensors_stream import safetensors_parts


def _tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "t/values": torch.randn(7, 5),
        "t/ids": torch.arange(7, dtype=torch.int64),
        "q/values": torch.randint(0, 255, (3, 13), dtype=torch.uint8),  # odd width: alignment matters
        "half": torch.randn(4, 3).half(),
        "bf": torch.randn(2, 2).bfloat16(),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 64),
        "scalar": torch.tensor(2.5),
        "strided": torch.randn(6, 4)[:, 1],  # not contiguous: copied
    }


def test_parts_concatenate_to_the_bytes_safetensors_writes() -> None:
    tensors = _tensors()
    streamed = b"".join(bytes(p) for p in safetensors_parts(tensors))
    assert streamed == safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()})
    loaded = safetensors.torch.load(streamed)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_a_contiguous_tensor_is_viewed_not_copied() -> None:
    values = torch.randn(1000, 64)
    parts = safetensors_parts({"v": values})
    values[0, 0] = 123.0  # the view sees the change: no copy was taken
    assert torch.frombuffer(bytearray(parts[1][:4]), dtype=torch.float32).item() == 123.0


def test_an_unknown_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'c'.*complex64.*cannot store"):
        safetensors_parts({"c": torch.zeros(2, dtype=torch.complex64)})
