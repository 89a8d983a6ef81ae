"""Old switch names (review follow-up): the rename warning points at the code that read the switch,
whichever accessor it went through, and a value an old name never took is refused as the new
names refuse theirs. The old names are taken from the table (tests/test_switches.py keeps them out
of every other file)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from lightrec import _switches
from lightrec._switches import Decision, OnOff, SwitchError


def _read_direct() -> object:
    return _switches.TRITON.read()


def _read_off_reason() -> object:
    return _switches.TRITON.off_reason()


def _read_decision() -> object:
    return Decision(_switches.TRITON, lambda: None).available()


def _set_old(monkeypatch: pytest.MonkeyPatch, switch: OnOff, value: str) -> str:
    """Set ``switch``'s old name to ``value`` (the new name unset, nothing warned yet); returns the old name."""
    old = switch.replaces[0].name
    monkeypatch.delenv(switch.name, raising=False)
    monkeypatch.setenv(old, value)
    monkeypatch.setattr(_switches, "_warned", set())
    return old


@pytest.mark.parametrize(
    "read", [_read_direct, _read_off_reason, _read_decision], ids=["read", "off_reason", "Decision"]
)
def test_rename_warning_points_at_the_code_that_read_the_switch(
    monkeypatch: pytest.MonkeyPatch, read: Callable[[], object]
) -> None:
    _set_old(monkeypatch, _switches.TRITON, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read()
    renamed = [w for w in caught if issubclass(w.category, _switches.RenamedSwitchWarning)]
    assert len(renamed) == 1
    assert (renamed[0].filename, renamed[0].lineno) == (__file__, read.__code__.co_firstlineno + 1)


@pytest.mark.parametrize(
    ("switch", "value"),
    [
        (_switches.CPU_UPDATE_NATIVE, "stock"),
        (_switches.MCH_NATIVE, "tourch"),
        (_switches.NATIVE, "banana"),
        (_switches.FBGEMM, "2"),
    ],
    ids=lambda p: p.name if isinstance(p, OnOff) else p,
)
def test_a_bad_value_of_an_old_name_is_refused_naming_old_value_and_new(
    monkeypatch: pytest.MonkeyPatch, switch: OnOff, value: str
) -> None:
    old = _set_old(monkeypatch, switch, value)
    with pytest.raises(SwitchError) as e:
        switch.read()
    message = str(e.value)
    assert old in message and repr(value) in message and switch.name in message, message


@pytest.mark.parametrize(
    ("switch", "value", "expected"),
    [
        (_switches.CPU_UPDATE_NATIVE, "native", True),
        (_switches.CPU_UPDATE_NATIVE, "Torch", False),
        (_switches.MCH_NATIVE, "native", True),
        (_switches.NATIVE, "true", False),
        (_switches.FBGEMM, "false", True),
        (_switches.TRITON, "0", True),
    ],
    ids=lambda p: p.name if isinstance(p, OnOff) else str(p),
)
def test_the_values_old_names_take_still_work(
    monkeypatch: pytest.MonkeyPatch, switch: OnOff, value: str, expected: bool
) -> None:
    _set_old(monkeypatch, switch, value)
    with pytest.warns(_switches.RenamedSwitchWarning):
        assert switch.read() is expected
