"""``lightrec serve``: an exported artifact behind HTTP, with dynamic batching and live model updates.

The server is LitServe (Lightning's model server) around one ``LitAPI``; this package holds its
parts, one purpose per file:

* ``config.py`` -- :class:`ServeConfig`, every option of ``lightrec serve``, checked up front;
* ``request_forms.py`` -- the request bodies (one sample, a list, the compact batch form), decoded
  and validated per request with ``lightrec.inference.Predictor``'s rules;
* ``batching.py`` -- requests joined into the artifact's batch inputs, scores split back;
* ``served_model.py`` -- :class:`ServedModel` (predictor + version + lock) and the contract of live
  updates, :class:`ModelUpdater` / :class:`ModelUpdate`; ``model_updates.py`` -- the thread that
  follows an updater, and ``--deltas``' updater; ``deltas/`` -- applying the versions of a publish
  folder (``docs/deltas.md``) to the served artifact;
* ``api.py`` -- ``RecServingAPI``, the ``LitAPI``; ``admission.py`` -- the API key, 413 on large
  bodies, 408 on slow ones, 503 on overload; ``endpoints.py`` -- ``/ready``, ``/metrics``; ``metrics.py`` -- shared-memory metrics in
  Prometheus' format; ``transport.py`` -- the pipes between HTTP servers and workers, and
  ``/predict`` bodies straight to the workers; ``scoring_loop.py`` -- the workers' loop;
  ``server.py`` -- :func:`~lightrec.serving.server.build_server` and ``serve``.

This module imports no LitServe (an optional dependency: ``pip install "lightrec[serve]"``), so the
update contract is importable where only the model is: ``from lightrec.serving import ServedModel``.
The server itself is ``lightrec.serving.server``. See ``docs/serving.md`` ("Serve it").
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightrec.serving.config import ServeConfig, ServeConfigError
    from lightrec.serving.model_updates import UpdateFollower
    from lightrec.serving.served_model import (
        ModelDamaged,
        ModelUpdate,
        ModelUpdater,
        PredictorMismatch,
        ServedModel,
        UpdateFailed,
        UpdateRefused,
        UpdaterFactory,
    )

# Imported when first named (PEP 562): ``lightrec serve``'s parser reads only ``config``, and the
# update contract's modules pull in the inference and distributed stacks (seconds on a small VM).
_HOMES = {"ServeConfig": "config", "ServeConfigError": "config", "UpdateFollower": "model_updates"}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'lightrec.serving' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lightrec.serving.{_HOMES.get(name, 'served_model')}"), name)


__all__ = [
    "ModelDamaged",
    "ModelUpdate",
    "ModelUpdater",
    "PredictorMismatch",
    "ServeConfig",
    "ServeConfigError",
    "ServedModel",
    "UpdateFailed",
    "UpdateFollower",
    "UpdateRefused",
    "UpdaterFactory",
]
