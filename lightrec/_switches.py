"""Every environment variable lightrec reads, declared once: name, type, default, what it does, old names.

docs/switches.md is this table for readers (``tests/test_switches.py`` keeps the two equal). Each
switch is read through its one typed accessor, :meth:`Switch.read`, at the moment the code that
uses it needs it (per call, or once per process where the decision is cached -- the docs say which).
Unset and empty mean the same: the default.

Kinds of switch::

    on/off     "0" turns the feature off (a native path, fbgemm, Triton, the shared-memory transport),
               "1" turns it on; also false/true, off/on, no/yes. Anything else is an error.
    choice     one of a few words, e.g. LIGHTREC_CPU_KERNEL=auto|fbgemm|torch.
    path       a folder.
    seconds    a positive number.

Old names keep working: an earlier spelling (``LIGHTREC_DISABLE_NATIVE=1``, ``LIGHTREC_MCH_STEP=torch``, ...)
is translated to the new one when the new name is not set, with one :class:`RenamedSwitchWarning` (a
``DeprecationWarning``) per old name and process that names the new spelling, attributed to the first
caller outside this module (the code that read the switch). A value an old name never took is a
:class:`SwitchError`, as for the new names.

lightrec also reads variables it does not own -- ``TRITON_INTERPRET``, the launchers' ``RANK`` /
``LOCAL_RANK`` and Lightning's ``fabric run`` variables, glibc's ``MALLOC_*`` -- with their owners'
meaning: :data:`FOREIGN` declares them (and the three lightrec writes, with why), docs/switches.md
lists them.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

__all__ = [
    "ARGS_CHECKED",
    "CACHE_DIR",
    "CPU_KERNEL",
    "CPU_UPDATE_NATIVE",
    "FBGEMM",
    "FOREIGN",
    "MALLOC_POLICY",
    "MCH_NATIVE",
    "NATIVE",
    "SHM",
    "SHM_ALLREDUCE",
    "SHM_DIR",
    "SHM_TIMEOUT",
    "SWITCHES",
    "TIERED_NATIVE",
    "TRITON",
    "Choice",
    "Decision",
    "Folder",
    "Foreign",
    "OldName",
    "OnOff",
    "RenamedSwitchWarning",
    "Seconds",
    "Switch",
    "SwitchError",
]

T_co = TypeVar("T_co", covariant=True)  # a switch of bools is a switch of objects: read() only returns it

_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")
_warned: set[str] = set()  # old names already warned about in this process


class SwitchError(ValueError):
    """An environment switch holds a value lightrec cannot read (the message names it and the fix)."""


class RenamedSwitchWarning(DeprecationWarning):
    """An old name of a switch was set: it still works; the message names the new spelling."""


@dataclass(frozen=True)
class OldName:
    """An earlier spelling of a switch, still read when the new name is not set.

    Attributes:
        name: the old variable, e.g. ``LIGHTREC_DISABLE_NATIVE``.
        meaning: how to read it, e.g. ``"=1"`` or ``"=torch"``.
        takes: the values it takes (lower case; compared case-insensitively); any other is an error.
        translate: a value it takes (lower-cased) -> the new name's value, or None when it asked for nothing.
    """

    name: str
    meaning: str
    takes: tuple[str, ...]
    translate: Callable[[str], str | None]


def disable_flag(name: str) -> OldName:
    """``LIGHTREC_DISABLE_X=1`` (or true/on/yes: off) -> ``=0`` of the new on/off switch; ``=0`` (or
    false/off/no) asks for nothing."""
    return OldName(name, "=1", _ON + _OFF, lambda value: "0" if value in _ON else None)


def torch_word(name: str) -> OldName:
    """``NAME=torch`` (the stock torch ops instead of the native path) -> ``=0`` of the new switch;
    ``NAME=native`` asks for nothing."""
    return OldName(name, "=torch", ("torch", "native"), lambda value: "0" if value == "torch" else None)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this module, for a warning raised in the caller
    of this function: the code that read the switch, whichever accessor it went through."""
    level, frame = 1, sys._getframe(1)  # level 1: the caller, which calls warnings.warn
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        level, frame = level + 1, frame.f_back
    return level


@dataclass(frozen=True)
class Switch(ABC, Generic[T_co]):
    """One environment variable: its name, what it does, when it is read, the names it replaces."""

    kind: ClassVar[str]
    name: str
    doc: str
    replaces: tuple[OldName, ...] = ()

    @property
    @abstractmethod
    def default_text(self) -> str:
        """The default, as docs/switches.md shows it."""

    @abstractmethod
    def read(self) -> T_co:
        """The switch's value now (the default when unset or empty).

        Raises:
            SwitchError: a value this switch does not take.
        """

    def raw(self) -> str | None:
        """The variable's text: the new name's, else an old name's translated value, else None."""
        value = os.environ.get(self.name, "")
        if value:
            return value
        for old in self.replaces:
            old_value = os.environ.get(old.name, "")
            if not old_value:
                continue
            if old_value.lower() not in old.takes:
                raise SwitchError(
                    f"{old.name} must be one of {list(old.takes)}, got {old_value!r}; it is an old name of "
                    f"{self.name}: set {self.name} instead, or unset both for the default ({self.default_text}) "
                    "(docs/switches.md)"
                )
            translated = old.translate(old_value.lower())
            if old.name not in _warned:
                _warned.add(old.name)
                now = f"set {self.name}={translated}" if translated is not None else f"unset it ({self.name} replaces it)"
                warnings.warn(
                    f"{old.name} is an old name of {self.name}: {now}; it still works for now (docs/switches.md)",
                    RenamedSwitchWarning,
                    stacklevel=_caller_stacklevel(),  # the code that read the switch
                )
            if translated is not None:
                return translated
        return None

    def _error(self, value: str, expected: str) -> SwitchError:
        return SwitchError(f"{self.name} must be {expected}, got {value!r}; unset it for the default ({self.default_text})")


@dataclass(frozen=True)
class OnOff(Switch[bool]):
    """``=0`` turns it off, ``=1`` on (see the module docstring)."""

    kind: ClassVar[str] = "on/off"
    default: bool = True

    @property
    def default_text(self) -> str:
        return "1" if self.default else "0"

    def read(self) -> bool:
        value = self.raw()
        if value is None:
            return self.default
        if value.lower() in _OFF:
            return False
        if value.lower() in _ON:
            return True
        raise self._error(value, "0 (off) or 1 (on)")

    def off_reason(self) -> str | None:
        """None when the switch is on, else the reason a caller reports: ``disabled by NAME=0``."""
        return None if self.read() else f"disabled by {self.name}=0"


class Decision:
    """Whether what an on/off switch gates can be used in this process, decided at the first question
    and kept: the switch first (``disabled by NAME=0``, without calling ``probe``), then ``probe``,
    which returns None when it can, else why not (an optional dependency that does not import).

    Args:
        switch: the switch that turns the feature off.
        probe: ``() -> reason or None``, called at most once per process.
    """

    def __init__(self, switch: OnOff, probe: Callable[[], str | None]) -> None:
        self.switch = switch
        self._probe = probe
        self._decided = False
        self._reason: str | None = None

    def _decide(self) -> str | None:
        if not self._decided:
            off = self.switch.off_reason()
            self._reason = off if off is not None else self._probe()
            self._decided = True
        return self._reason

    def available(self) -> bool:
        """True when the feature can be used here."""
        return self._decide() is None

    def unavailable_reason(self) -> str | None:
        """Why the feature cannot be used here, or None when it can."""
        return self._decide()


@dataclass(frozen=True)
class Choice(Switch[str]):
    """One of ``choices``."""

    kind: ClassVar[str] = "choice"
    choices: tuple[str, ...] = ()
    default: str = ""

    @property
    def default_text(self) -> str:
        return self.default

    def read(self) -> str:
        value = self.raw()
        if value is None:
            return self.default
        if value not in self.choices:
            raise self._error(value, f"one of {list(self.choices)}")
        return value


@dataclass(frozen=True)
class Folder(Switch[Path]):
    """A folder; the default's ``~`` is the user's home."""

    kind: ClassVar[str] = "path"
    default: str = ""

    @property
    def default_text(self) -> str:
        return self.default

    def read(self) -> Path:
        value = self.raw()
        return Path(value) if value is not None else Path(os.path.expanduser(self.default))


@dataclass(frozen=True)
class Seconds(Switch[float | None]):
    """A positive number of seconds; None when unset (the caller's own default, ``default_doc``)."""

    kind: ClassVar[str] = "seconds"
    default_doc: str = ""

    @property
    def default_text(self) -> str:
        return self.default_doc

    def read(self) -> float | None:
        value = self.raw()
        if value is None:
            return None
        try:
            seconds = float(value)
        except ValueError:
            raise self._error(value, "a positive number of seconds") from None
        if not 0.0 < seconds < math.inf:
            raise self._error(value, "a positive number of seconds")
        return seconds


# ---- the table --------------------------------------------------------------------------------------

NATIVE = OnOff(
    "LIGHTREC_NATIVE",
    "build and load lightrec's native CPU ops (`lightrec/csrc`) at first use; 0: the pure-torch paths and gloo, "
    "silently (read once per process)",
    (disable_flag("LIGHTREC_DISABLE_NATIVE"),),
)
FBGEMM = OnOff(
    "LIGHTREC_FBGEMM",
    "use fbgemm-gpu where it is installed and matches torch; 0: the pure-torch kernels, without the warning "
    "(read once per process)",
    (disable_flag("LIGHTREC_DISABLE_FBGEMM"),),
)
TRITON = OnOff(
    "LIGHTREC_TRITON",
    "use Triton where it imports; 0: behave as if Triton were absent (read once per process)",
    (disable_flag("LIGHTREC_DISABLE_TRITON"),),
)
CPU_UPDATE_NATIVE = OnOff(
    "LIGHTREC_CPU_UPDATE_NATIVE",
    "the torch kernel's fused update on CPU as one native pass; 0: the stock-op update, for comparisons "
    "(read when a kernel is built)",
    (torch_word("LIGHTREC_CPU_UPDATE"),),
)
MCH_NATIVE = OnOff(
    "LIGHTREC_MCH_NATIVE",
    "a managed-collision table's training step on CPU as one native op; 0: its torch-op path (read per step)",
    (torch_word("LIGHTREC_MCH_STEP"),),
)
TIERED_NATIVE = OnOff(
    "LIGHTREC_TIERED_NATIVE",
    "a tiered table's cache bookkeeping, row copies and read-ahead on CPU as native ops; 0: its torch-op path "
    "(read when a tiered kernel is built)",
)
SHM = OnOff(
    "LIGHTREC_SHM",
    "exchange between the ranks of one host through shared memory; 0: gloo carries everything "
    "(read per process group)",
)
SHM_ALLREDUCE = OnOff(
    "LIGHTREC_SHM_ALLREDUCE",
    "all-reduce the dense part's gradients (DistributedModelParallel's DDP on CPU gloo ranks of one host) "
    "through shared memory; 0: DDP's gloo all-reduce (read when the dense part is wrapped)",
)
CPU_KERNEL = Choice(
    "LIGHTREC_CPU_KERNEL",
    "which fused CPU kernel `kernel_backend=\"auto\"` runs where fbgemm and the torch kernel both serve: "
    "auto measures both once per case (threads, dim, optimizer, ids per bag), cached under LIGHTREC_CACHE_DIR "
    "(read once per case and process); where they can share the tables both are built and the faster over the "
    "first 86 training steps trains the group, elsewhere the group is decided at 1 and 32 ids per bag (torch only if it wins "
    "at both); under `torch.use_deterministic_algorithms(True)` (`Trainer(deterministic=True)`) auto takes the torch "
    "kernel without timing anything",
    choices=("auto", "fbgemm", "torch"),
    default="auto",
)
MALLOC_POLICY = Choice(
    "LIGHTREC_MALLOC_POLICY",
    "glibc malloc thresholds of training ranks when `RecStrategy(malloc_policy=None)` and no "
    "`lightrec run --malloc-policy` (read per RecStrategy)",
    choices=("tuned", "default"),
    default="tuned",
)
CACHE_DIR = Folder(
    "LIGHTREC_CACHE_DIR",
    "where lightrec keeps what it measured about this machine, `cpu_kernel_choice.json` (read when `auto` "
    "chooses, once per case and process)",
    default="~/.cache/lightrec",
)
SHM_DIR = Folder(
    "LIGHTREC_SHM_DIR",
    "the shared-memory filesystem of the intra-host transport's segments (read at import)",
    default="/dev/shm",
)
SHM_TIMEOUT = Seconds(
    "LIGHTREC_SHM_TIMEOUT",
    "how long a shared-memory exchange waits for a peer before it raises (read per process group)",
    default_doc="the process group's timeout",
)
ARGS_CHECKED = OnOff(
    "LIGHTREC_ARGS_CHECKED",
    "internal: set to 1 by a recipe's launching process for the ranks Lightning starts, which then skip the "
    "argument checks already done (read per recipe run)",
    default=False,
)

#: Every switch, in the order docs/switches.md lists them.
SWITCHES: tuple[Switch[object], ...] = (
    NATIVE,
    FBGEMM,
    TRITON,
    CPU_UPDATE_NATIVE,
    MCH_NATIVE,
    TIERED_NATIVE,
    SHM,
    SHM_ALLREDUCE,
    CPU_KERNEL,
    MALLOC_POLICY,
    CACHE_DIR,
    SHM_DIR,
    SHM_TIMEOUT,
    ARGS_CHECKED,
)


@dataclass(frozen=True)
class Foreign:
    """A variable of another tool that lightrec reads (or writes) with that tool's meaning.

    Attributes:
        name: the variable.
        owner: whose it is (Triton, the launchers, Lightning, glibc, the shell).
        use: what lightrec does with it, and why it writes it where it does.
    """

    name: str
    owner: str
    use: str


#: The other tools' variables lightrec reads, in the order docs/switches.md lists them.
FOREIGN: tuple[Foreign, ...] = (
    Foreign("TRITON_INTERPRET", "Triton", "1: Triton's CPU interpreter is on, so lightrec's Triton kernels may run on CPU "
            "tensors (tests); set it before lightrec's kernels are imported"),
    Foreign("RANK", "torchrun, SLURM, Lightning", "a recipe's arguments are checked on global rank 0 only"),
    Foreign("LOCAL_RANK", "torchrun, SLURM, Lightning", "`@local_rank` in a tiered table's `ssd_storage_directory`"),
    Foreign("LT_CLI_USED", "Lightning's `fabric run`", "1: a recipe runs under `fabric run` and takes its settings "
            "(the four below)"),
    Foreign("LT_ACCELERATOR", "Lightning's `fabric run`", "the recipe's `--trainer.accelerator`"),
    Foreign("LT_DEVICES", "Lightning's `fabric run`", "the recipe's `--trainer.devices`"),
    Foreign("LT_NUM_NODES", "Lightning's `fabric run`", "the recipe's `--trainer.num_nodes`"),
    Foreign("LT_PRECISION", "Lightning's `fabric run`", "the recipe's `--trainer.precision`"),
    Foreign("MALLOC_MMAP_THRESHOLD_", "glibc", "kept when set; else written by the malloc policy (`tuned`: 32 MiB) "
            "-- in the environment because the ranks a launcher execs read it only at start"),
    Foreign("MALLOC_TRIM_THRESHOLD_", "glibc", "kept when set; else written by the malloc policy (`tuned`: 1 GiB), "
            "for the same reason"),
    Foreign("LITSERVE_WORKER_ID", "LitServe", "which `lightrec serve` worker (or HTTP server) this process is: the "
            "index its metrics are kept under (0 outside LitServe)"),
    Foreign("TORCH_EXTENSIONS_DIR", "torch", "where lightrec's native ops are built and found (default "
            "`~/.cache/torch_extensions`), as torch's `cpp_extension.load` reads it; one `lightrec_native-<key>` "
            "folder per torch install and lightrec source tree"),
    Foreign("PATH", "the shell", "pip's `ninja` is put in front while the native ops build, then PATH is restored: "
            "torch's build finds `ninja` only there"),
)
