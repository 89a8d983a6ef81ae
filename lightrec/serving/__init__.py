"""Serving a model: following a publish folder and applying its versions to a loaded artifact
(:mod:`lightrec.serving.deltas`); the ``lightrec serve`` server sits beside it."""
