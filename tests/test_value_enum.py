"""``lightrec._enum.ValueEnum``: every enum that prints as its value does so through the one base class."""

from __future__ import annotations

import pickle
from enum import Enum

import pytest

from lightrec._enum import ValueEnum
from lightrec.distributed.fbgemm_qcomm_codec import CommType
from lightrec.distributed.planner import EmbeddingComputeKernel, ShardingType
from lightrec.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from lightrec.modules.embedding_configs import DataType
from lightrec.optim.fused_spec import EmbOptimType

MEMBERS = [
    DataType.FP16,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,  # an alias: prints its canonical member's value
    CommType.BF16,
    ShardingType.TABLE_ROW_WISE,
    EmbeddingComputeKernel.KEY_VALUE,
    MetricName.NE,
    MetricNamespace.THROUGHPUT,
    MetricPrefix.LIFETIME,
]


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: type(m).__name__)
def test_str_and_format_are_the_value(member: ValueEnum) -> None:
    assert isinstance(member, ValueEnum) and isinstance(member, Enum)
    assert str(member) == f"{member}" == member.value
    assert f"{member:>20}" == f"{member.value:>20}"
    assert repr(member).startswith(f"<{type(member).__name__}.")  # repr keeps the member's name
    assert pickle.loads(pickle.dumps(member)) is member


@pytest.mark.parametrize("member", [m for m in MEMBERS if isinstance(m, str)], ids=lambda m: type(m).__name__)
def test_string_enums_still_equal_their_values(member: str) -> None:
    assert member == str(member) and hash(member) == hash(str(member)) and {str(member): 1}[member] == 1


def test_plain_enums_are_not_strings() -> None:
    assert DataType.FP16 != "FP16" and not isinstance(DataType.FP16, str)
