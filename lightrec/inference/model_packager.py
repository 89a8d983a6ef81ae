"""torchrec's ``torchrec.inference.model_packager``: a ``PredictFactory`` and its configs in one
``torch.package`` archive, the form torchrec's C++ inference server loads.

::

    class Packager(PredictFactoryPackager):
        @classmethod
        def set_extern_modules(cls, pe): pe.extern(["torch.**", "numpy.**", "lightrec.**"])
        @classmethod
        def set_mocked_modules(cls, pe): pe.mock(["tensorboard.**"])

    Packager.save_predict_factory(MyFactory, {"model_path": "model.pt"}, "model.package", extra_files={})
    factory = load_predict_factory("model.package")          # lightrec's way back (PackageImporter)

Inside the package the factory's module reads its configs with :func:`load_config_text` /
:func:`load_pickle_config`, as under torchrec. The archive is written atomically.
"""

from __future__ import annotations

import abc
import os
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, TypeVar

from torch.package import PackageExporter, PackageImporter

from lightrec.inference.modules import PredictFactory

__all__ = [
    "CONFIG_MODULE",
    "LOADER_MODULE",
    "PredictFactoryPackager",
    "load_config_text",
    "load_pickle_config",
    "load_predict_factory",
]

LOADER_MODULE = "__module_loader"
LOADER_FACTORY = "MODULE_FACTORY"
LOADER_CODE = f"""
import %PACKAGE%

{LOADER_FACTORY}=%PACKAGE%.%CLASS%
"""
CONFIG_MODULE = "__configs"

T = TypeVar("T")


def _importer() -> PackageImporter:
    """The ``PackageImporter`` of the packaged code that called us.

    A packaged module sees the importer as the module ``torch_package_importer``; lightrec itself is
    usually extern'd (imported from the host), so the importer is found through the caller's
    ``__import__``, which ``torch.package`` binds to the importer of the package the caller came from.
    """
    try:
        import torch_package_importer  # type: ignore[import-not-found]  # only exists inside a package

        return torch_package_importer
    except ImportError:
        pass
    frame = sys._getframe(1)
    while frame is not None:
        builtins = frame.f_globals.get("__builtins__")
        hook = builtins.get("__import__") if isinstance(builtins, dict) else None
        if isinstance(getattr(hook, "__self__", None), PackageImporter):
            return hook.__self__  # type: ignore[union-attr]
        frame = frame.f_back  # type: ignore[assignment]
    raise RuntimeError("load_config_text / load_pickle_config work only in code loaded from a torch.package")


def load_config_text(name: str) -> str:
    """A text config saved by ``save_predict_factory`` (call from inside the package)."""
    text: str = _importer().load_text(CONFIG_MODULE, name)
    return text


def load_pickle_config(name: str, clazz: type[T]) -> T:
    """A pickled config saved by ``save_predict_factory``, checked to be a ``clazz``."""
    loaded = _importer().load_pickle(CONFIG_MODULE, name)
    if not isinstance(loaded, clazz):
        raise TypeError(f"config {name!r} is a {type(loaded).__name__}, expected {clazz.__name__}")
    return loaded


class PredictFactoryPackager:
    """Subclass it and say which modules stay outside the package (``set_extern_modules``) or are
    replaced by stubs (``set_mocked_modules``); everything else imported is packaged."""

    @classmethod
    @abc.abstractmethod
    def set_extern_modules(cls, pe: PackageExporter) -> None: ...

    @classmethod
    @abc.abstractmethod
    def set_mocked_modules(cls, pe: PackageExporter) -> None: ...

    @classmethod
    def save_predict_factory(
        cls,
        predict_factory: type[PredictFactory],
        configs: dict[str, object],
        output: str | Path | BinaryIO,
        extra_files: dict[str, str],
        loader_code: str = LOADER_CODE,
    ) -> None:
        """Write ``predict_factory``'s module, a loader naming it, ``configs`` (text or pickled) and
        ``extra_files`` into a ``torch.package`` archive at ``output``."""
        if not (isinstance(predict_factory, type) and issubclass(predict_factory, PredictFactory)):
            raise TypeError(f"predict_factory must be a PredictFactory subclass, got {predict_factory!r}")
        if isinstance(output, (str, Path)):
            path = Path(output)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent or ".")
            os.close(fd)
            try:
                cls._write(predict_factory, configs, tmp, extra_files, loader_code)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:
            cls._write(predict_factory, configs, output, extra_files, loader_code)

    @classmethod
    def _write(
        cls,
        predict_factory: type[PredictFactory],
        configs: dict[str, object],
        output: str | BinaryIO,
        extra_files: dict[str, str],
        loader_code: str,
    ) -> None:
        with PackageExporter(output) as pe:
            cls.set_extern_modules(pe)
            cls.set_mocked_modules(pe)
            pe.intern("**")
            for name, text in extra_files.items():
                pe.save_text("extra_files", name, text)
            code = loader_code.replace("%PACKAGE%", predict_factory.__module__).replace("%CLASS%", predict_factory.__name__)
            pe.save_source_string(module_name=LOADER_MODULE, src=code)
            for name, config in configs.items():
                if isinstance(config, str):
                    pe.save_text(CONFIG_MODULE, name, config)
                else:
                    pe.save_pickle(CONFIG_MODULE, name, config)
            pe.save_module(predict_factory.__module__)


def load_predict_factory(path: str | Path | BinaryIO) -> type[PredictFactory]:
    """The ``PredictFactory`` class stored by ``save_predict_factory`` (through its loader module)."""
    importer = PackageImporter(path)
    factory: type[PredictFactory] = getattr(importer.import_module(LOADER_MODULE), LOADER_FACTORY)
    return factory
