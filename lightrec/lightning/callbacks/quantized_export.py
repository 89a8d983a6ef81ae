"""``QuantizedExport`` callback: write a quantized serving artifact at fit end (and every N epochs).

::

    trainer = Trainer(strategy=RecStrategy(), devices=2,
                      callbacks=[QuantizedExport(dtype="int8", format="torchscript", every_n_epochs=1)])
    trainer.fit(module)            # -> <log_dir>/export/model_int8.pt  (+ model_int8.pt.meta.json)

At the end of training (``on_train_end``, while the sharded model and its process group are still
set up) and, with ``every_n_epochs``, after every N-th training epoch, the callback

1. takes the LightningModule's model (``pl_module.<model_attr>``; a module's ``for_serving(model)``,
   when it defines one, picks the part that serves requests);
2. quantizes it with :func:`lightrec.inference.quantize`: under ``RecStrategy`` the tables are
   sharded, so **every rank** joins the gather of the full tables (one table at a time) and the
   quantized copy lands on rank 0; an unsharded model is quantized by rank 0 alone;
3. on rank 0, exports it with :func:`lightrec.inference.export` (artifact + metadata JSON, each
   written to a temporary file and moved into place with ``os.replace``, so a serving process
   polling the folder never reads half a file); the metadata also records ``epoch`` and
   ``global_step``;
4. tells every rank whether rank 0 succeeded (a failure raises on every rank, not only on rank 0),
   logs the path (printed on rank 0) and ``export/artifact_mib`` to the trainer's loggers.

Works the same with a plain single-process ``Trainer``. Under ``Trainer(fast_dev_run=...)`` nothing
is exported (as Lightning writes no checkpoint then); a fit that raises or is interrupted exports
nothing at its end either (Lightning does not run ``on_train_end`` then). The fit-end artifact is
named after the epoch its last batch trained in (the ``epoch`` of the epoch exports, not Lightning's
``current_epoch``, which counts that epoch as done by then).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from typing_extensions import override

from lightrec.inference import (
    EXPORT_FORMATS,
    export_on_rank,
    has_sharded_collections,
    quantize,
    resolve_data_type,
)
from lightrec.inference.gather import sharding_group
from lightrec.lightning.contracts import ServingModelProvider

__all__ = ["QuantizedExport"]

_SUFFIX = {"torchscript": ".pt", "export": ".pt2"}


class QuantizedExport(pl.Callback):
    """Export the trained model, quantized, as a serving artifact (see the module docstring).

    Args:
        dirpath: folder of the artifacts; default ``<trainer.log_dir>/export`` (``trainer.log_dir``
            is ``default_root_dir`` without a logger).
        dtype: table storage type: ``"int8"``, ``"int4"`` or ``"fp16"`` (torch dtypes work too).
        format: ``"torchscript"`` (``.pt``) or ``"export"`` (``torch.export``, ``.pt2``).
        every_n_epochs: also export after every N-th training epoch; None exports only at fit end.
        filename: artifact name, a ``str.format`` template over ``{epoch}``, ``{step}`` and
            ``{dtype}``; default ``"model_{dtype}"`` (each export replaces the last, atomically).
            The format's suffix (``.pt``/``.pt2``) is added unless the name already ends in ``.pt`` or
            ``.pt2`` (``"model_v1.5"`` becomes ``model_v1.5.pt``).
        per_table: ``{table: dtype}`` overrides, as in ``quantize``.
        quantize_dense: also make ``nn.Linear`` layers dynamic int8 (TorchScript only).
        model_attr: attribute of the LightningModule holding the model (default ``"model"``).

    Attributes:
        paths: every artifact written by this callback so far, in order (on every rank).
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        dtype: Any = "int8",
        format: str = "torchscript",
        every_n_epochs: int | None = None,
        filename: str | None = None,
        per_table: dict[str, Any] | None = None,
        quantize_dense: bool = False,
        model_attr: str = "model",
    ) -> None:
        super().__init__()
        self.data_type = resolve_data_type(dtype, "dtype")
        if format not in EXPORT_FORMATS:
            raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {format!r}")
        if format == "export" and quantize_dense:
            raise ValueError("quantize_dense=True (dynamic int8 Linear) exports only as format='torchscript'")
        if every_n_epochs is not None and (isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int)
                                           or every_n_epochs <= 0):
            raise ValueError(f"every_n_epochs must be None (fit end only) or a positive int, got {every_n_epochs!r}")
        self.filename = filename if filename is not None else "model_{dtype}"
        try:
            self.filename.format(epoch=0, step=0, dtype="int8")
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:  # {epoch.x}, {epoch[0]} too
            raise ValueError(f"filename {self.filename!r} may only use the fields {{epoch}}, {{step}} and {{dtype}}: "
                             f"{type(exc).__name__}: {exc}") from exc
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.format = format
        self.every_n_epochs = every_n_epochs
        self.per_table = dict(per_table) if per_table else None
        self.quantize_dense = quantize_dense
        self.model_attr = model_attr
        self.paths: list[Path] = []
        self._last_step: int | None = None  # global step of this fit's latest export
        self._epoch: int | None = None  # epoch of this fit's latest trained batch

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            # trainer.log_dir broadcasts rank 0's folder: a collective, so resolve it here, where
            # every rank runs.
            self.dirpath = Path(trainer.log_dir or trainer.default_root_dir) / "export"

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step = self._epoch = None  # a new fit (another Trainer may restart the step count)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch = trainer.current_epoch

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._skip(trainer):
            return
        if self.every_n_epochs is not None and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.export_now(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._skip(trainer):
            return
        if self._last_step != trainer.global_step:  # not already exported at this step by the epoch hook
            # Lightning counts the last epoch as done by now (current_epoch is one past it): name the
            # artifact after the epoch its last batch trained in, as the epoch exports are
            self.export_now(trainer, pl_module, epoch=self._epoch)

    def _skip(self, trainer: pl.Trainer) -> bool:
        """``fast_dev_run`` is a smoke test: no artifact, as Lightning writes no checkpoint (every rank
        decides the same)."""
        # the Trainer sets fast_dev_run in its debugging connector (no declared attribute for type checkers)
        if not getattr(trainer, "fast_dev_run", False):
            return False
        rank_zero_info("QuantizedExport: fast_dev_run is set, no artifact is exported")
        return True

    # ------------------------------------------------------------------ export
    def serving_model(self, pl_module: pl.LightningModule) -> nn.Module:
        """The module to export: ``pl_module.<model_attr>``, through ``pl_module.for_serving`` if defined
        (``lightrec.lightning.contracts.ServingModelProvider``)."""
        model = getattr(pl_module, self.model_attr, None)  # the attribute the user named
        if not isinstance(model, nn.Module):
            raise AttributeError(
                f"QuantizedExport exports pl_module.{self.model_attr}, but {type(pl_module).__name__} has no module "
                f"there (got {type(model).__name__}); pass model_attr='<attribute holding the model>'"
            )
        return pl_module.for_serving(model) if isinstance(pl_module, ServingModelProvider) else model

    def artifact_path(self, trainer: pl.Trainer, epoch: int | None = None) -> Path:
        """Where the next export goes (the filename template filled with epoch, step and dtype).

        ``epoch`` defaults to ``trainer.current_epoch``."""
        epoch = trainer.current_epoch if epoch is None else epoch
        name = self.filename.format(epoch=epoch, step=trainer.global_step,
                                    dtype=self.data_type.value.lower())
        # Only an artifact suffix counts: "model_v1.5" has the Path suffix ".5" but is no .pt file.
        if not name.endswith(tuple(_SUFFIX.values())):
            name += _SUFFIX[self.format]
        assert self.dirpath is not None  # set in setup()
        return self.dirpath / name

    def export_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int | None = None) -> Path:
        """Quantize and export now (every rank must call this together under a sharding strategy).

        Args:
            epoch: the epoch recorded in the name and metadata; default ``trainer.current_epoch``.

        Returns:
            The artifact path (on every rank, once rank 0 has written it).
        """
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "export"
        model = self.serving_model(pl_module)
        sharded = has_sharded_collections(model)
        group = sharding_group(model)[0] if sharded else None
        epoch = trainer.current_epoch if epoch is None else epoch
        path = self.artifact_path(trainer, epoch)

        def build() -> nn.Module | None:
            if not sharded and not trainer.is_global_zero:
                return None  # a replicated model: rank 0's copy is the model
            quantized = quantize(model, dtype=self.data_type, per_table=self.per_table,
                                 quantize_dense=self.quantize_dense, dst=0 if sharded else None)
            return quantized.to(torch.device("cpu")) if quantized is not None else None

        meta = {"epoch": epoch, "global_step": trainer.global_step, "exported_by": "QuantizedExport"}
        was_training = model.training
        try:
            with torch.no_grad(), warnings.catch_warnings():
                # TorchScript's note on annotations inside __init__ of the scripted modules: not actionable.
                warnings.filterwarnings("ignore", message=".*instance-level annotations on empty non-base types")
                export_on_rank(build, path, group=group, dst=0, format=self.format, extra_meta=meta)
        finally:  # a failed export (raised on every rank) must not leave a caller's model in eval mode
            model.train(was_training)
        self.paths.append(path)
        self._last_step = trainer.global_step
        rank_zero_info(f"QuantizedExport: epoch {epoch}, step {trainer.global_step}: wrote "
                       f"{self.data_type.value.lower()} {self.format} artifact {path}")
        if trainer.is_global_zero:
            self._log(trainer, path)
        return path

    def _log(self, trainer: pl.Trainer, path: Path) -> None:
        size = path.stat().st_size / 2**20
        for logger in trainer.loggers:
            logger.log_metrics({"export/artifact_mib": size}, step=trainer.global_step)
            # A logger whose experiment takes text (TensorBoard's SummaryWriter and look-alikes):
            # Lightning's Logger declares no such method, so it is read where present.
            add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
            if callable(add_text):
                add_text("export/path", str(path), trainer.global_step)
