"""``HashZchManagedCollisionModule`` refuses bad bucket ranges and opt-in tables too small to reserve
rows with a ``ValueError`` that names the argument and the value (not an IndexError or a division by
zero at the first batch)."""

from __future__ import annotations

import pytest
import torch

from lightrec.modules.managed_collision import HashZchManagedCollisionModule


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_bucket": 5}, r"start_bucket=5"),
        ({"end_bucket": 7}, r"end_bucket=7"),
        ({"start_bucket": -1}, r"start_bucket=-1"),
        ({"start_bucket": 1, "end_bucket": 1}, r"start_bucket=1.*end_bucket=1"),
    ],
)
def test_bucket_range_outside_the_table_is_a_value_error(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HashZchManagedCollisionModule(4, "cpu", total_num_buckets=2, **kwargs)  # type: ignore[arg-type]


def test_opt_in_with_one_row_per_bucket_is_a_value_error() -> None:
    # One row per bucket leaves no row for admitted ids once a row is reserved.
    with pytest.raises(ValueError, match=r"opt_in_prob=50.*2 rows"):
        HashZchManagedCollisionModule(4, "cpu", total_num_buckets=4, opt_in_prob=50, percent_reserved_slots=10)


def test_opt_in_with_two_rows_per_bucket_remaps() -> None:
    module = HashZchManagedCollisionModule(8, "cpu", total_num_buckets=4, opt_in_prob=50,
                                           percent_reserved_slots=10).train()  # fmt: skip
    rows = module.remap_values(torch.arange(1, 40))
    assert bool(((rows >= 0) & (rows < 8)).all())
