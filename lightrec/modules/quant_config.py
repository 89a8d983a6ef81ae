"""Which storage type each table gets when a model is quantized for serving.

``QuantConfig`` (defined in :mod:`lightrec.modules.embedding_configs`, where torchrec has it) is
torchrec's two-observer config (``activation`` says what the lookup returns,
``weight`` what the table stores); lightrec reads only the observers' ``dtype``. Everything else
in lightrec speaks :class:`~lightrec.modules.DataType`; :func:`resolve_data_type` turns every
spelling users write (``torch.int8``, ``"int4"``, ``DataType.FP16``, an observer) into one.
"""

from __future__ import annotations

import torch

from lightrec.modules.embedding_configs import DataType, QuantConfig

__all__ = ["QUANTIZED_DATA_TYPES", "QuantConfig", "resolve_data_type", "data_type_from_qconfig"]

# Storage types the quantized collections serve (fbgemm's IntN TBE supports exactly these on CPU).
QUANTIZED_DATA_TYPES = (DataType.INT8, DataType.INT4, DataType.FP16)


_DTYPE_TO_DATA_TYPE: dict[torch.dtype, DataType] = {
    torch.int8: DataType.INT8,
    torch.uint8: DataType.INT8,
    torch.qint8: DataType.INT8,
    torch.quint8: DataType.INT8,
    torch.quint4x2: DataType.INT4,
    torch.float16: DataType.FP16,
}

_NAME_TO_DATA_TYPE: dict[str, DataType] = {
    "int8": DataType.INT8,
    "int4": DataType.INT4,
    "fp16": DataType.FP16,
    "float16": DataType.FP16,
    "half": DataType.FP16,
}


def resolve_data_type(dtype: object, argument: str = "dtype") -> DataType:
    """Map ``torch.int8``/``torch.quint4x2``/``torch.float16``, the strings ``"int8"``/``"int4"``/``"fp16"``
    or a ``DataType`` to the ``DataType`` a table stores.

    Raises:
        ValueError: ``dtype`` names no supported storage type (the message lists them).
    """
    if isinstance(dtype, DataType):
        if dtype in QUANTIZED_DATA_TYPES:
            return dtype
    elif isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_TO_DATA_TYPE:
            return _DTYPE_TO_DATA_TYPE[dtype]
    elif isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in _NAME_TO_DATA_TYPE:
            return _NAME_TO_DATA_TYPE[key]
        if key.upper() in DataType.__members__ and DataType[key.upper()] in QUANTIZED_DATA_TYPES:
            return DataType[key.upper()]
    raise ValueError(
        f"{argument}={dtype!r} is not a supported embedding storage type; use torch.int8 / 'int8', "
        "torch.quint4x2 / 'int4' or torch.float16 / 'fp16'"
    )


def data_type_from_qconfig(qconfig: object) -> DataType:
    """The table storage type a ``QuantConfig`` (or any object with a ``weight`` observer factory) asks for.

    Raises:
        TypeError: ``qconfig`` has no ``weight`` observer factory.
        ValueError: the activation is not float32, or the weight dtype is unsupported.
    """
    weight = getattr(qconfig, "weight", None)
    if weight is None:
        raise TypeError(
            f"the module's qconfig must be a QuantConfig(activation=..., weight=...), got {qconfig!r}; "
            "pass qconfig_spec={EmbeddingBagCollection: QuantConfig(...)} to quantize_dynamic"
        )
    weight_dtype = getattr(weight(), "dtype", None)
    activation = getattr(qconfig, "activation", None)
    if activation is not None:
        activation_dtype = getattr(activation(), "dtype", torch.float32)
        if activation_dtype not in (torch.float32, None):
            raise ValueError(
                f"QuantConfig.activation dtype must be torch.float (lookups return float32), got {activation_dtype}"
            )
    return resolve_data_type(weight_dtype, "QuantConfig.weight dtype")
