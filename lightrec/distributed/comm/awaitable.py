"""Awaitables: results of work that is still in flight (a collective, a kernel on another stream).

Sharded modules return an :class:`Awaitable` instead of a tensor so the caller decides when to
block: start the input all-to-all of batch ``i + 1``, run the dense part of batch ``i``, and only
then call ``.wait()``. :class:`LazyAwaitable` goes one step further: it waits by itself the first
time the result is *used* (an attribute, a method, an operator, a ``torch`` function), so code
written for eager modules keeps working unchanged::

    class ExampleAwaitable(LazyAwaitable[torch.Tensor]):
        def __init__(self, size: list[int]) -> None:
            super().__init__()
            self._size = size

        def _wait_impl(self) -> torch.Tensor:
            return torch.ones(self._size)

    a = ExampleAwaitable([3, 2])
    a.shape            # resolves: torch.Size([3, 2])
    a + 1              # resolves: tensor of 2s
    a.wait()           # the same tensor object as above

Every awaitable resolves at most once: ``wait()`` caches its result, so waiting twice never
re-runs a collective (which would deadlock or double-count gradients). Likewise a ``wait()`` that
raised raises the same error again when called again (the work is not retried).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

__all__ = ["Awaitable", "AwaitableList", "GetItemLazyAwaitable", "LazyAwaitable", "LazyGetItemMixin", "LazyNoWait", "NoWait", "wait_all"]

W = TypeVar("W")
U = TypeVar("U")
K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)
V_co = TypeVar("V_co", covariant=True)


class _Indexable(Protocol[K_contra, V_co]):
    """A value ``v`` with ``v[key]`` (a ``KeyedTensor``, a dict, a tuple ...)."""

    def __getitem__(self, key: K_contra, /) -> V_co: ...

# Attributes set by the base classes; ``LazyAwaitable.__getattr__`` must never forward them to
# the result (that would recurse while the object is half constructed).
_OWN_ATTRS = frozenset({"_callbacks", "_error", "_resolved", "_result", "_wait_impl"})


class Awaitable(abc.ABC, Generic[W]):
    """A value of type ``W`` that becomes available when :meth:`wait` is called.

    Subclasses implement :meth:`_wait_impl` (block until the work is done and return the value).
    Callbacks registered with :attr:`callbacks` (torchrec style, each ``W -> W``) or chained with
    :meth:`then` (any ``W -> U``) run once, in order, on the value.
    """

    def __init__(self) -> None:
        self._callbacks: list[Callable[[W], W]] = []
        self._resolved: bool = False
        self._result: W | None = None
        self._error: BaseException | None = None  # what the first wait() raised, raised again

    @abc.abstractmethod
    def _wait_impl(self) -> W:
        """Block until the value exists and return it (called at most once)."""

    @property
    def callbacks(self) -> list[Callable[[W], W]]:
        """Mutable list of ``W -> W`` functions applied in order to the result by :meth:`wait`."""
        return self._callbacks

    def wait(self) -> W:
        """Block until the value is ready, apply the callbacks, and return it (cached)."""
        if not self._resolved:
            if self._error is not None:
                raise self._error  # the first wait failed: re-running the work would not be the same exchange
            try:
                result = self._wait_impl()
                for callback in self._callbacks:
                    result = callback(result)
            except Exception as exc:
                self._error = exc
                raise
            self._result = result
            self._resolved = True
            # Callbacks may hold large closures (buffers of the collective); free them.
            self._callbacks = []
        return cast(W, self._result)  # set above: W, which may itself admit None

    def then(self, fn: Callable[[W], U]) -> Awaitable[U]:
        """A new awaitable whose value is ``fn(self.wait())``; nothing runs until it is waited."""
        return _Then(self, fn)

    @property
    def is_resolved(self) -> bool:
        """True once :meth:`wait` has produced the value."""
        return self._resolved


class _Then(Awaitable[U], Generic[W, U]):
    def __init__(self, source: Awaitable[W], fn: Callable[[W], U]) -> None:
        super().__init__()
        self._source = source
        self._fn = fn

    def _wait_impl(self) -> U:
        return self._fn(self._source.wait())


class NoWait(Awaitable[W]):
    """An awaitable wrapping a value that is already available (``wait()`` returns it)."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class AwaitableList(Awaitable[list[W]]):
    """Waits for several awaitables, in order, and returns the list of their values."""

    def __init__(self, awaitables: Sequence[Awaitable[W]]) -> None:
        super().__init__()
        self._awaitables = list(awaitables)

    def __len__(self) -> int:
        return len(self._awaitables)

    def _wait_impl(self) -> list[W]:
        return [a.wait() for a in self._awaitables]


def wait_all(awaitables: Sequence[Awaitable[W]]) -> list[W]:
    """Wait for every awaitable in order and return their values."""
    return [a.wait() for a in awaitables]


def _resolve(obj: Any) -> Any:
    """Replace every :class:`LazyAwaitable` inside ``obj`` (nested lists/tuples/dicts) by its value."""
    if isinstance(obj, LazyAwaitable):
        return obj.wait()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_resolve(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _resolve(v) for k, v in obj.items()}
    return obj


class LazyAwaitable(Awaitable[W]):
    """An :class:`Awaitable` that resolves itself as soon as its value is used.

    Every attribute or method that ``LazyAwaitable`` itself lacks (``.shape``, ``.values()``,
    ``.to_dict()`` ...), Python operators (``+``, ``[]``, ``len`` ...) and ``torch`` functions
    (``torch.cat([lazy, x])``, ``lazy @ w``) call :meth:`wait` first and act on the value. This lets a
    sharded module return a lazy result that callers treat like the eager module's output while
    the communication still overlaps with whatever the caller does before touching it.

    ``isinstance(lazy, torch.Tensor)`` is False: code that type-checks its input must call
    ``.wait()`` itself.
    """

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, i.e. for attributes of the *result*.
        if name in _OWN_ATTRS or (name.startswith("__") and name.endswith("__")):
            # Missing own state means a subclass skipped ``super().__init__()``; dunder probes
            # (copy, pickle) must not trigger a collective.
            raise AttributeError(
                f"{type(self).__name__!r} has no attribute {name!r}"
                + (" (did the subclass call super().__init__()?)" if name in _OWN_ATTRS else "")
            )
        return getattr(self.wait(), name)

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return func(*_resolve(args), **_resolve(kwargs or {}))

    def __repr__(self) -> str:
        state = "resolved" if self.__dict__.get("_resolved") else "pending"
        return f"<{type(self).__name__} ({state})>"


def _forward_op(name: str) -> Callable[..., Any]:
    def op(self: LazyAwaitable[Any], *args: Any) -> Any:
        return getattr(self.wait(), name)(*_resolve(args))

    op.__name__ = name
    op.__doc__ = f"Resolve, then apply ``{name}`` to the value."
    return op


# Python looks operators up on the type, not through ``__getattr__``: forward each explicitly.
for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__pow__", "__rpow__",
    "__matmul__", "__rmatmul__", "__neg__", "__pos__", "__abs__", "__and__", "__or__",
    "__xor__", "__invert__", "__lt__", "__le__", "__gt__", "__ge__", "__getitem__",
    "__len__", "__iter__", "__contains__", "__float__", "__int__", "__index__", "__bool__",
):  # fmt: skip
    setattr(LazyAwaitable, _name, _forward_op(_name))
del _name


class LazyNoWait(NoWait[W], LazyAwaitable[W]):
    """A :class:`LazyAwaitable` wrapping a value that is already available (:class:`NoWait`'s storage,
    ``LazyAwaitable``'s resolve-on-use)."""


class GetItemLazyAwaitable(LazyAwaitable[W], Generic[K, W]):
    """``parent[key]`` of a lazy result, itself lazy: nothing waits until the item is used."""

    def __init__(self, parent: LazyAwaitable[_Indexable[K, W]], key: K) -> None:
        super().__init__()
        self._parent = parent
        self._key = key

    def _wait_impl(self) -> W:
        return self._parent.wait()[self._key]


class LazyGetItemMixin(Generic[K, W]):
    """Mix into a ``LazyAwaitable`` (before it in the bases) so ``result[key]`` stays lazy.

    torchrec's mixin: ``out["f1"]`` on a sharded collection's result returns a
    :class:`GetItemLazyAwaitable` instead of waiting for the whole result at once.
    """

    def __getitem__(self, key: K) -> LazyAwaitable[W]:
        if not isinstance(self, LazyAwaitable):
            raise TypeError(f"LazyGetItemMixin needs a LazyAwaitable subclass, got {type(self).__name__}")
        # The class it is mixed into resolves to a value indexed by K (its LazyAwaitable's value).
        parent = cast("LazyAwaitable[_Indexable[K, W]]", self)
        return GetItemLazyAwaitable(parent, key)
