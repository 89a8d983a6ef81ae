"""JSON serializers of lightrec's embedding modules for the ``torch.export`` round trip
(``torchrec.ir.serializer``).

Before export, :meth:`JsonSerializer.encapsulate_module` writes a module's configuration as JSON
into a non-persistent ``uint8`` buffer named ``ir_metadata``; ``torch.export`` keeps it as a
constant of the program (the state dict is unchanged), next to the module's parameters. After
``torch.export.load`` and ``torch.export.unflatten``, :meth:`JsonSerializer.decapsulate_module`
reads the buffer of the rebuilt submodule, builds a fresh eager module from it and copies the
program's parameters into it, so the module comes back with its weights. The buffer holds::

    {"typename": "lightrec.modules.embedding_modules.EmbeddingBagCollection",
     "metadata_dict": {"tables": [...], "is_weighted": false, "device": "cpu", "bounds_check": "error"}}

Unlike torchrec, encapsulation keeps the module's own ``forward``: the exported program computes
the real lookups (``ep.module()`` gives the model's outputs, not placeholders), and the round trip
restores weights without a separate ``load_state_dict``.

Registered: ``EmbeddingBagCollection``, ``EmbeddingCollection``, ``PositionWeightedModule``,
``PositionWeightedModuleCollection`` and ``FeatureProcessedEmbeddingBagCollection`` (built from
its rebuilt children). A serializer for another module type subclasses :class:`JsonSerializer`
and registers itself: ``JsonSerializer.module_to_serializer_cls[qualname(MyModule)] = MySerializer``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from lightrec.ir.schema import (
    EBCMetadata,
    ECMetadata,
    EmbeddingBagConfigMetadata,
    EmbeddingConfigMetadata,
    FPEBCMetadata,
    PositionWeightedModuleCollectionMetadata,
    PositionWeightedModuleMetadata,
    from_dict,
)
from lightrec.ir.types import IRMetadataError, SerializerInterface, UnknownModuleTypeError, qualname
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_processor_ import (
    FeatureProcessor,
    FeatureProcessorsCollection,
    PositionWeightedModule,
    PositionWeightedModuleCollection,
)
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

__all__ = [
    "IR_METADATA",
    "EBCJsonSerializer",
    "ECJsonSerializer",
    "FPEBCJsonSerializer",
    "JsonSerializer",
    "PWMCJsonSerializer",
    "PWMJsonSerializer",
    "embedding_bag_config_to_metadata",
    "embedding_config_to_metadata",
    "embedding_metadata_to_config",
    "get_deserialized_device",
]

logger = logging.getLogger(__name__)

#: Name of the buffer that marks a module as serialized (torchrec's convention).
IR_METADATA = "ir_metadata"


# ------------------------------------------------------------------------------ table configs
def _table_fields(config: EmbeddingConfig | EmbeddingBagConfig) -> dict[str, Any]:
    return {
        "num_embeddings": config.num_embeddings,
        "embedding_dim": config.embedding_dim,
        "name": config.name,
        "data_type": config.data_type.value,
        "feature_names": list(config.feature_names),
        "weight_init_max": config.weight_init_max,
        "weight_init_min": config.weight_init_min,
        "need_pos": config.need_pos,
        "num_embeddings_post_pruning": config.num_embeddings_post_pruning,
    }


def embedding_bag_config_to_metadata(table_config: EmbeddingBagConfig) -> EmbeddingBagConfigMetadata:
    """The JSON form of a pooled table's config (``init_fn`` is dropped: the weights travel instead)."""
    return EmbeddingBagConfigMetadata(**_table_fields(table_config), pooling=table_config.pooling.value)


def embedding_config_to_metadata(table_config: EmbeddingConfig) -> EmbeddingConfigMetadata:
    """The JSON form of an unpooled table's config."""
    return EmbeddingConfigMetadata(**_table_fields(table_config))


def embedding_metadata_to_config(
    table_config: EmbeddingConfigMetadata,
) -> EmbeddingBagConfig | EmbeddingConfig:
    """The config back: an ``EmbeddingBagConfig`` for bag metadata, else an ``EmbeddingConfig``.

    Raises:
        IRMetadataError: an unknown data type or pooling, or values the config refuses.
    """
    fields = {f.name: getattr(table_config, f.name) for f in dataclasses.fields(EmbeddingConfigMetadata)}
    where = f"table {fields.get('name')!r}"
    try:
        fields["data_type"] = DataType(fields["data_type"])
        if isinstance(table_config, EmbeddingBagConfigMetadata):
            return EmbeddingBagConfig(**fields, pooling=PoolingType(table_config.pooling))
        return EmbeddingConfig(**fields)
    except (ValueError, TypeError) as e:
        raise IRMetadataError(f"the metadata of {where} does not make a table config: {e}") from e


def get_deserialized_device(
    config_device: str | None, device: torch.device | str | None
) -> torch.device | None:
    """``device`` if given (a warning when it overrides the recorded device's type), else the recorded one.

    Raises:
        ValueError: ``device`` is a string torch cannot parse.
        IRMetadataError: the recorded device is one torch cannot parse.
    """
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device={device!r} is not a device torch knows; pass e.g. 'cpu' or 'cuda:0'") from e
    if not config_device:
        return device
    try:
        original = torch.device(config_device)
    except RuntimeError as e:
        raise IRMetadataError(f"the metadata records device {config_device!r}, which torch cannot parse") from e
    if device is None:
        return original
    if original.type != device.type:
        logger.warning("deserialized device=%s overrides the original device=%s", device, original)
    return device


# ------------------------------------------------------------------------------ the dispatcher
class JsonSerializer(SerializerInterface):
    """Serializer of the ``torch.export`` round trip, in JSON; dispatches on the module's :func:`qualname`.

    Subclasses handle one module type each: they set ``_module_cls`` (and ``_children``, the
    attributes rebuilt first and handed to :meth:`deserialize_from_dict` through ``unflatten_ep``)
    and override :meth:`serialize_to_dict` / :meth:`deserialize_from_dict`.
    """

    module_to_serializer_cls: ClassVar[dict[str, type[Any]]] = {}
    _module_cls: ClassVar[type[nn.Module] | None] = None
    _children: ClassVar[list[str] | None] = None

    # --- per-type hooks
    @classmethod
    def children(cls, module: nn.Module) -> list[str]:
        """Attributes of ``module`` serialized on their own (their weights and metadata stay theirs)."""
        return list(cls._children or [])

    @classmethod
    def serialize_to_dict(cls, module: nn.Module) -> dict[str, Any]:
        """JSON-able metadata of ``module`` (dispatched to its registered serializer)."""
        serializer = cls.serializer_for(qualname(module), module)
        if serializer is cls:
            raise UnknownModuleTypeError(f"{cls.__name__} must override serialize_to_dict to serialize {qualname(module)}")
        return serializer.serialize_to_dict(module)

    @classmethod
    def deserialize_from_dict(
        cls,
        metadata_dict: dict[str, Any],
        device: torch.device | None = None,
        unflatten_ep: nn.Module | None = None,
    ) -> nn.Module:
        """A fresh module built from ``metadata_dict`` (a serializer of one type overrides this)."""
        raise UnknownModuleTypeError(
            f"{cls.__name__} handles no module type: call deserialize(metadata, typename) or a registered serializer"
        )

    @classmethod
    def swap_meta_forward(cls, module: nn.Module) -> None:
        """Change ``module``'s forward for export; lightrec's serializers keep the real forward."""

    @classmethod
    def load_exported_state(cls, module: nn.Module, exported: nn.Module) -> None:
        """Copy the program's tensors (``exported``'s parameters and buffers) into the rebuilt ``module``.

        Raises:
            IRMetadataError: ``exported`` lacks one of ``module``'s tensors or holds another shape.
        """
        own = [(n, t) for n, t in module.state_dict(keep_vars=True).items() if n != IR_METADATA]
        source = dict(exported.named_parameters()) | dict(exported.named_buffers())
        missing = [n for n, _ in own if n not in source]
        if missing:
            raise IRMetadataError(
                f"the exported {qualname(module)} has no tensors {missing} (it has {sorted(source)}); "
                "was the program exported from a module of another configuration?"
            )
        with torch.no_grad():
            for name, tensor in own:
                if tensor.shape != source[name].shape:
                    raise IRMetadataError(
                        f"{qualname(module)}.{name}: the program holds shape {tuple(source[name].shape)}, "
                        f"the metadata describes {tuple(tensor.shape)}"
                    )
                if tensor.device.type != "meta":
                    tensor.copy_(source[name])

    # --- SerializerInterface
    @classmethod
    def serializer_for(cls, typename: str, module: nn.Module | None = None) -> type[JsonSerializer]:
        """The serializer registered for ``typename`` (a :func:`qualname`, or a bare class name).

        Raises:
            UnknownModuleTypeError: none is registered.
        """
        registry = cls.module_to_serializer_cls
        serializer = registry.get(typename) or registry.get(typename.rsplit(".", 1)[-1])
        if serializer is None:
            raise UnknownModuleTypeError(
                f"no serializer for module type {typename!r}; registered: {sorted(registry)}. Register one with "
                f"JsonSerializer.module_to_serializer_cls[{typename!r}] = <a JsonSerializer subclass>"
            )
        if module is not None and serializer._module_cls is not None and not isinstance(module, serializer._module_cls):
            raise UnknownModuleTypeError(
                f"{serializer.__name__} serializes {serializer._module_cls.__name__}, got {qualname(module)}"
            )
        return serializer

    @classmethod
    def serialize(cls, module: nn.Module) -> dict[str, Any]:
        """``{"typename": qualname(module), "metadata_dict": {...}}``: JSON-able, no tensors."""
        typename = qualname(module)
        serializer = cls.serializer_for(typename, module)
        return {"typename": typename, "metadata_dict": serializer.serialize_to_dict(module)}

    @classmethod
    def deserialize(  # the interface's signature; ``input`` is torchrec's parameter name
        cls, input: Any, typename: str, device: torch.device | None = None, children: Mapping[str, nn.Module] | None = None
    ) -> nn.Module:
        """:meth:`SerializerInterface.deserialize`; ``input`` is the ``metadata_dict`` (or its JSON text)
        and the module comes with freshly initialised weights."""
        metadata = json.loads(input) if isinstance(input, (str, bytes)) else input
        serializer = cls.serializer_for(typename)
        holder = nn.Module()
        for name, child in (children or {}).items():
            holder.add_module(name, child)
        return serializer.deserialize_from_dict(metadata, device, holder)

    @classmethod
    def requires_children(cls, typename: str) -> bool:
        return bool(cls.serializer_for(typename)._children)

    # --- the buffer
    @classmethod
    def encapsulate_module(cls, module: nn.Module) -> list[str]:
        """Write ``module``'s metadata into its ``ir_metadata`` buffer; returns the children to visit."""
        raw = cls.serialize(module)
        serializer = cls.serializer_for(raw["typename"], module)
        data = bytearray(json.dumps(raw).encode())
        module.register_buffer(IR_METADATA, torch.frombuffer(data, dtype=torch.uint8), persistent=False)
        serializer.swap_meta_forward(module)
        return serializer.children(module)

    @classmethod
    def decapsulate_module(cls, module: nn.Module, device: torch.device | None = None) -> nn.Module:
        """The eager module ``module``'s ``ir_metadata`` describes, holding ``module``'s tensors.

        Raises:
            IRMetadataError: the buffer is missing or not the JSON :meth:`encapsulate_module` writes.
            UnknownModuleTypeError: it names a type no serializer is registered for.
        """
        raw = read_ir_metadata(module)
        serializer = cls.serializer_for(raw["typename"])
        rebuilt = serializer.deserialize_from_dict(raw["metadata_dict"], device, module)
        if serializer._module_cls is not None and not isinstance(rebuilt, serializer._module_cls):
            raise UnknownModuleTypeError(
                f"{serializer.__name__} built a {qualname(rebuilt)}, not a {serializer._module_cls.__name__}"
            )
        serializer.load_exported_state(rebuilt, module)
        return rebuilt


def read_ir_metadata(module: nn.Module) -> dict[str, Any]:
    """The ``{"typename", "metadata_dict"}`` object of ``module``'s ``ir_metadata`` buffer.

    Raises:
        IRMetadataError: no such buffer, or it does not hold that JSON object.
    """
    buffers = dict(module.named_buffers(recurse=False))
    if IR_METADATA not in buffers:
        raise IRMetadataError(f"{qualname(module)} has no {IR_METADATA!r} buffer: it was not encapsulated")
    data = buffers[IR_METADATA].detach().cpu().numpy().tobytes()
    try:
        raw = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IRMetadataError(f"the {IR_METADATA!r} buffer of {qualname(module)} is not JSON: {e}") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("typename"), str) or "metadata_dict" not in raw:
        raise IRMetadataError(
            f"the {IR_METADATA!r} buffer of {qualname(module)} must hold {{'typename': str, 'metadata_dict': ...}}, "
            f"got {str(raw)[:200]}"
        )
    return raw


def _child(parent: nn.Module | None, name: str, kind: type[nn.Module], where: str) -> nn.Module:
    children = dict(parent.named_children()) if parent is not None else {}
    child = children.get(name)
    if not isinstance(child, kind):
        raise IRMetadataError(
            f"{where} is built from its rebuilt child {name!r} ({kind.__name__}), got "
            f"{type(child).__name__ if child is not None else 'nothing'}; decapsulate its children first "
            "(decapsulate_ir_modules does)"
        )
    return child


# ------------------------------------------------------------------------------ one serializer per type
class _CollectionJsonSerializer(JsonSerializer):
    """The two collections: their tables, device and bounds check, plus one flag each
    (``is_weighted`` of a bag collection, ``need_indices`` of a sequence collection)."""

    _metadata_cls: ClassVar[type[EBCMetadata] | type[ECMetadata]]
    _table_cls: ClassVar[type[EmbeddingConfigMetadata]]

    @classmethod
    def serialize_to_dict(cls, module: nn.Module) -> dict[str, Any]:
        if isinstance(module, EmbeddingBagCollection):
            tables = [embedding_bag_config_to_metadata(t) for t in module.embedding_bag_configs()]
            bags = EBCMetadata(tables, module.is_weighted(), str(module.device), module._bounds_check)
            return dataclasses.asdict(bags)
        assert isinstance(module, EmbeddingCollection)  # serializer_for checked the type
        unpooled = [embedding_config_to_metadata(t) for t in module.embedding_configs()]
        return dataclasses.asdict(ECMetadata(unpooled, module.need_indices(), str(module.device), module._bounds_check))

    @classmethod
    def deserialize_from_dict(
        cls, metadata_dict: dict[str, Any], device: torch.device | None = None, unflatten_ep: nn.Module | None = None
    ) -> nn.Module:
        assert cls._module_cls is not None
        where = cls._module_cls.__name__
        metadata = from_dict(cls._metadata_cls, metadata_dict, f"{where} metadata")
        tables = [embedding_metadata_to_config(from_dict(cls._table_cls, t, f"{where} table")) for t in metadata.tables]
        on = get_deserialized_device(metadata.device, device)
        try:
            if isinstance(metadata, EBCMetadata):
                bags = [t for t in tables if isinstance(t, EmbeddingBagConfig)]  # all of them: bag metadata
                return EmbeddingBagCollection(bags, metadata.is_weighted, on, metadata.bounds_check)
            unpooled = [t for t in tables if isinstance(t, EmbeddingConfig)]
            return EmbeddingCollection(unpooled, on, metadata.need_indices, metadata.bounds_check)
        except ValueError as e:  # e.g. an unknown bounds_check, or two tables of one name
            raise IRMetadataError(f"{where} metadata does not make a collection: {e}") from e


class EBCJsonSerializer(_CollectionJsonSerializer):
    """``EmbeddingBagCollection`` <-> :class:`~lightrec.ir.schema.EBCMetadata`."""

    _module_cls = EmbeddingBagCollection
    _metadata_cls = EBCMetadata
    _table_cls = EmbeddingBagConfigMetadata


class ECJsonSerializer(_CollectionJsonSerializer):
    """``EmbeddingCollection`` <-> :class:`~lightrec.ir.schema.ECMetadata`."""

    _module_cls = EmbeddingCollection
    _metadata_cls = ECMetadata
    _table_cls = EmbeddingConfigMetadata


class PWMJsonSerializer(JsonSerializer):
    """``PositionWeightedModule`` <-> its longest bag and dtype."""

    _module_cls = PositionWeightedModule

    @classmethod
    def serialize_to_dict(cls, module: nn.Module) -> dict[str, Any]:
        assert isinstance(module, PositionWeightedModule)
        dtype = str(module.position_weight.dtype).removeprefix("torch.")
        return dataclasses.asdict(PositionWeightedModuleMetadata(module.max_feature_length, dtype))

    @classmethod
    def deserialize_from_dict(
        cls, metadata_dict: dict[str, Any], device: torch.device | None = None, unflatten_ep: nn.Module | None = None
    ) -> nn.Module:
        metadata = from_dict(PositionWeightedModuleMetadata, metadata_dict, "PositionWeightedModule metadata")
        dtype = getattr(torch, metadata.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise IRMetadataError(f"PositionWeightedModule metadata: dtype {metadata.dtype!r} is not a torch dtype")
        try:
            return PositionWeightedModule(metadata.max_feature_length, dtype=dtype, device=device)
        except ValueError as e:
            raise IRMetadataError(f"PositionWeightedModule metadata: {e}") from e


class PWMCJsonSerializer(JsonSerializer):
    """``PositionWeightedModuleCollection`` <-> its ``[feature, longest bag]`` pairs."""

    _module_cls = PositionWeightedModuleCollection

    @classmethod
    def serialize_to_dict(cls, module: nn.Module) -> dict[str, Any]:
        assert isinstance(module, PositionWeightedModuleCollection)
        pairs = [(f, n) for f, n in module.max_feature_lengths.items()]  # a list keeps the order in JSON
        return dataclasses.asdict(PositionWeightedModuleCollectionMetadata(pairs))

    @classmethod
    def deserialize_from_dict(
        cls, metadata_dict: dict[str, Any], device: torch.device | None = None, unflatten_ep: nn.Module | None = None
    ) -> nn.Module:
        where = "PositionWeightedModuleCollection metadata"
        metadata = from_dict(PositionWeightedModuleCollectionMetadata, metadata_dict, where)
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in metadata.max_feature_lengths):
            raise IRMetadataError(f"{where}: max_feature_lengths must be [feature, length] pairs")
        try:
            return PositionWeightedModuleCollection({f: n for f, n in metadata.max_feature_lengths}, device=device)
        except ValueError as e:
            raise IRMetadataError(f"{where}: {e}") from e


class FPEBCJsonSerializer(JsonSerializer):
    """``FeatureProcessedEmbeddingBagCollection``: rebuilt from its rebuilt processors and collection."""

    _module_cls = FeatureProcessedEmbeddingBagCollection
    _children = ["_feature_processors", "_embedding_bag_collection"]

    @classmethod
    def serialize_to_dict(cls, module: nn.Module) -> dict[str, Any]:
        assert isinstance(module, FeatureProcessedEmbeddingBagCollection)
        processors = module._feature_processors
        if isinstance(processors, FeatureProcessorsCollection):
            return dataclasses.asdict(FPEBCMetadata(is_fp_collection=True, features=[]))
        assert isinstance(processors, nn.ModuleDict)  # the constructor's only other kind
        return dataclasses.asdict(FPEBCMetadata(is_fp_collection=False, features=list(processors.keys())))

    @classmethod
    def deserialize_from_dict(
        cls, metadata_dict: dict[str, Any], device: torch.device | None = None, unflatten_ep: nn.Module | None = None
    ) -> nn.Module:
        where = "FeatureProcessedEmbeddingBagCollection"
        metadata = from_dict(FPEBCMetadata, metadata_dict, f"{where} metadata")
        ebc = _child(unflatten_ep, "_embedding_bag_collection", EmbeddingBagCollection, where)
        processors: FeatureProcessorsCollection | dict[str, FeatureProcessor]
        if metadata.is_fp_collection:
            found = _child(unflatten_ep, "_feature_processors", FeatureProcessorsCollection, where)
            assert isinstance(found, FeatureProcessorsCollection)
            processors = found
        else:
            holder = _child(unflatten_ep, "_feature_processors", nn.Module, where)
            processors = {}
            for feature in metadata.features:
                fp = _child(holder, feature, FeatureProcessor, f"{where}'s processors")
                assert isinstance(fp, FeatureProcessor)
                processors[feature] = fp
        assert isinstance(ebc, EmbeddingBagCollection)
        return FeatureProcessedEmbeddingBagCollection(ebc, processors)

    @classmethod
    def load_exported_state(cls, module: nn.Module, exported: nn.Module) -> None:
        """Nothing to copy: the children it is built from came back with their tensors."""


for _serializer in (EBCJsonSerializer, ECJsonSerializer, PWMJsonSerializer, PWMCJsonSerializer, FPEBCJsonSerializer):
    assert _serializer._module_cls is not None
    JsonSerializer.module_to_serializer_cls[qualname(_serializer._module_cls)] = _serializer
