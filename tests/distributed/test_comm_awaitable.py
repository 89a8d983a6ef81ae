"""Awaitable / LazyAwaitable semantics (single process: no collective involved)."""

from __future__ import annotations

import pytest
import torch

from lightrec.distributed.comm import Awaitable, AwaitableList, LazyAwaitable, LazyNoWait, NoWait, wait_all


class ExampleAwaitable(LazyAwaitable[torch.Tensor]):
    """The TorchRec tutorial's example, verbatim apart from the import."""

    def __init__(self, size: list[int]) -> None:
        super().__init__()
        self._size = size
        self.calls = 0

    def _wait_impl(self) -> torch.Tensor:
        self.calls += 1
        return torch.ones(self._size)


def test_tutorial_example_wait_returns_tensor_once() -> None:
    awaitable = ExampleAwaitable([3, 2])
    out = awaitable.wait()
    torch.testing.assert_close(out, torch.ones(3, 2))
    assert awaitable.wait() is out  # cached: _wait_impl ran once
    assert awaitable.calls == 1 and awaitable.is_resolved


def test_lazy_awaitable_resolves_on_use() -> None:
    a = ExampleAwaitable([3, 2])
    assert not a.is_resolved and "pending" in repr(a)
    assert a.shape == torch.Size([3, 2])  # attribute of the result
    assert a.is_resolved
    b = ExampleAwaitable([3, 2])
    torch.testing.assert_close(b + 1, torch.full((3, 2), 2.0))  # operator
    torch.testing.assert_close(2 * ExampleAwaitable([2]), torch.full((2,), 2.0))  # reflected operator
    torch.testing.assert_close(
        torch.cat([ExampleAwaitable([1, 2]), torch.zeros(1, 2)]), torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    )
    torch.testing.assert_close(ExampleAwaitable([2, 3]) @ torch.ones(3), torch.full((2,), 3.0))
    assert len(ExampleAwaitable([4, 1])) == 4
    assert ExampleAwaitable([2, 2])[0].tolist() == [1.0, 1.0]
    assert ExampleAwaitable([2]).sum().item() == 2.0  # method of the result


def test_callbacks_then_and_no_wait() -> None:
    a = ExampleAwaitable([2])
    a.callbacks.append(lambda t: t * 3)
    a.callbacks.append(lambda t: t + 1)
    chained = a.then(lambda t: t.sum().item())
    assert not a.is_resolved  # then() is lazy too
    assert chained.wait() == 8.0
    torch.testing.assert_close(a.wait(), torch.full((2,), 4.0))
    assert a.calls == 1
    assert NoWait(5).wait() == 5
    assert LazyNoWait(torch.ones(2)).sum().item() == 2.0
    assert AwaitableList([NoWait(1), NoWait(2)]).wait() == [1, 2]
    assert wait_all([NoWait("x"), ExampleAwaitable([1]).then(lambda t: t.item())]) == ["x", 1.0]


def test_abstract_and_forgotten_super_init() -> None:
    with pytest.raises(TypeError):
        Awaitable()  # type: ignore[abstract]

    class NoInit(LazyAwaitable[int]):
        def __init__(self) -> None:  # forgets super().__init__()
            pass

        def _wait_impl(self) -> int:
            return 1

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        NoInit().wait()
