"""torchrec's ``torchrec.types``: ``DataType`` and the module mixins torchrec code derives from.

``DataType`` is lightrec's own (its home is :mod:`lightrec.modules.embedding_configs`; this
module re-exports it). The mixins are torchrec's small contracts, kept here so a torchrec module
class that derives from them imports unchanged:

* :class:`CacheMixin` -- a module that caches computation can be told to drop the cache;
* :class:`CopyMixIn` -- how a module copies itself to a device: :class:`ModuleCopyMixin` moves it
  (``module.to(device)``), :class:`ModuleNoCopyMixin` returns it as it is (a module whose state
  must not be duplicated, such as a sharded collection).
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from lightrec.modules.embedding_configs import DataType

__all__ = ["CacheMixin", "CopyMixIn", "DataType", "ModuleCopyMixin", "ModuleNoCopyMixin"]


class CacheMixin(abc.ABC):
    """A module that caches computation and can drop the cache."""

    @abc.abstractmethod
    def clear_cache(self) -> None:
        """Forget every cached result."""


class CopyMixIn(abc.ABC):
    """A module that decides how it is copied to another device."""

    @abc.abstractmethod
    def copy(self, device: torch.device) -> nn.Module:
        """The module on ``device``."""


class ModuleCopyMixin(CopyMixIn):
    """Copy by moving: ``copy(device)`` is ``self.to(device)`` (the class must be an ``nn.Module``)."""

    def copy(self, device: torch.device) -> nn.Module:
        if not isinstance(self, nn.Module):
            raise TypeError(f"ModuleCopyMixin is for nn.Module classes, got {type(self).__name__}")
        return self.to(device)


class ModuleNoCopyMixin(CopyMixIn):
    """Never copied: ``copy(device)`` returns the module itself (the class must be an ``nn.Module``)."""

    def copy(self, device: torch.device) -> nn.Module:
        if not isinstance(self, nn.Module):
            raise TypeError(f"ModuleNoCopyMixin is for nn.Module classes, got {type(self).__name__}")
        return self
