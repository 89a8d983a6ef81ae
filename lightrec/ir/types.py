"""The serializer contract of the ``torch.export`` round trip (``torchrec.ir.types``), its errors and
the type names it keys serializers by.

A serializer turns an eager module (an embedding collection) into JSON-able metadata before
``torch.export`` and builds the eager module back from that metadata after ``torch.export.load``;
:mod:`lightrec.ir.serializer` implements it for lightrec's collections and
:mod:`lightrec.ir.utils` walks a model with it. Every method is a classmethod: serializers are
registries of behaviour, never instantiated.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = [
    "IRMetadataError",
    "IRSerializationError",
    "SerializerInterface",
    "UnknownModuleTypeError",
    "qualname",
]


class IRSerializationError(ValueError):
    """Base of the round trip's errors (a ``ValueError``, as torchrec raises)."""


class UnknownModuleTypeError(IRSerializationError):
    """A module type (or a ``typename`` read from metadata) that no serializer is registered for."""


class IRMetadataError(IRSerializationError):
    """Metadata that cannot be read back: not JSON, a missing or unknown field, a bad value, or
    tensors of the exported program that do not fit the module the metadata describes."""


def qualname(m: nn.Module | type[nn.Module]) -> str:
    """``module.path.ClassName`` of a module or module class: the key serializers are registered by.

    Example: ``qualname(EmbeddingBagCollection)`` is
    ``"lightrec.modules.embedding_modules.EmbeddingBagCollection"``.
    """
    cls = m if isinstance(m, type) else type(m)
    return f"{cls.__module__}.{cls.__qualname__}"


class SerializerInterface(abc.ABC):
    """How one family of modules is written into, and read back from, an exported program.

    ``module_to_serializer_cls`` maps a module's :func:`qualname` (or, as older torchrec did, its
    bare class name) to the serializer class that handles it.
    """

    module_to_serializer_cls: ClassVar[dict[str, type[Any]]] = {}

    @classmethod
    @abc.abstractmethod
    def serialize(cls, module: nn.Module) -> Any:
        """The metadata describing ``module`` (its configuration, not its weights)."""

    @classmethod
    @abc.abstractmethod
    def deserialize(
        cls,
        input: Any,  # noqa: A002 - torchrec's parameter name
        typename: str,
        device: torch.device | None = None,
        children: Mapping[str, nn.Module] | None = None,
    ) -> nn.Module:
        """A fresh module of type ``typename`` built from ``input`` (what :meth:`serialize` returned).

        Args:
            input: the metadata.
            typename: the :func:`qualname` of the module type to build.
            device: where to build it (``None``: the device recorded in the metadata).
            children: already rebuilt submodules, by attribute name, for modules made of others.
        """

    @classmethod
    def requires_children(cls, typename: str) -> bool:
        """Whether modules of ``typename`` are built from their (rebuilt) children."""
        return False
