"""``torch.export`` round trip of models with embedding collections (``torchrec.ir`` -> ``lightrec.ir``).

:func:`~lightrec.ir.utils.encapsulate_ir_modules` stores each collection's configuration in the
model before ``torch.export``; after ``torch.export.load`` and ``torch.export.unflatten``,
:func:`~lightrec.ir.utils.decapsulate_ir_modules` puts eager collections, with the program's
weights, back in their places. :mod:`lightrec.ir.serializer` holds the JSON serializers,
:mod:`lightrec.ir.schema` their layouts, :mod:`lightrec.ir.types` the interface and errors.
"""

from lightrec.ir import schema, serializer, types, utils
from lightrec.ir.serializer import JsonSerializer
from lightrec.ir.types import (
    IRMetadataError,
    IRSerializationError,
    SerializerInterface,
    UnknownModuleTypeError,
)
from lightrec.ir.utils import decapsulate_ir_modules, encapsulate_ir_modules, mark_dynamic_kjt

__all__ = [
    "IRMetadataError",
    "IRSerializationError",
    "JsonSerializer",
    "SerializerInterface",
    "UnknownModuleTypeError",
    "decapsulate_ir_modules",
    "encapsulate_ir_modules",
    "mark_dynamic_kjt",
    "schema",
    "serializer",
    "types",
    "utils",
]
