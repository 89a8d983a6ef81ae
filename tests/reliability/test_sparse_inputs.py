"""Deliver 6 (minimal, in ``KeyedJaggedTensor.validate()``): ids and lengths that would be silently wrong.

Before: ``validate=True`` accepted float ids; surplus values beyond the sum of lengths were
reported without naming where; float/uint8 ids and float lengths reached the kernels and raised
raw torch errors there. The collections' own input checks (issue 17 moves them) are not changed
here: ``validate()`` is where these checks live until that lands.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.sparse import KeyedJaggedTensor, SparseValueError


@pytest.mark.parametrize(
    ("values", "lengths", "match"),
    [
        (
            torch.tensor([1.0, 2.0, 3.0]),
            torch.tensor([1, 2]),
            r"values \(the ids\) of features \['f'\] must be int64 or int32, got torch.float32",
        ),
        (
            torch.tensor([1, 2, 3], dtype=torch.uint8),
            torch.tensor([1, 2]),
            r"values \(the ids\).*got torch.uint8",
        ),
        (
            torch.tensor([1, 2, 3]),
            torch.tensor([1.0, 2.0]),
            r"lengths of features \['f'\] must be int64 or int32, got torch.float32",
        ),
        (torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 2]), r"2 values beyond the last feature 'f'"),
    ],
)
def test_validate_refuses_silently_wrong_ids(values: torch.Tensor, lengths: torch.Tensor, match: str) -> None:
    with pytest.raises(SparseValueError, match=match):
        KeyedJaggedTensor(keys=["f"], values=values, lengths=lengths, validate=True)
    with pytest.raises(SparseValueError, match=match):
        KeyedJaggedTensor(keys=["f"], values=values, lengths=lengths).validate()


def test_negative_length_names_the_feature() -> None:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(2), lengths=torch.tensor([1, 1, 1, -1]))
    with pytest.raises(SparseValueError, match=r"feature 'b' has a negative length"):
        kjt.validate()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_ids_pass(dtype: torch.dtype) -> None:
    KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(4, dtype=dtype), lengths=torch.tensor([1, 1, 2, 0], dtype=dtype),
        validate=True,
    )  # fmt: skip
