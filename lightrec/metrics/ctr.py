"""torchrec's ``torchrec.metrics.ctr``: ``CTRMetric``, from :mod:`lightrec.metrics.rates` (where lightrec's
``CTR`` metric lives too)."""

from lightrec.metrics.rates import CTRMetric

__all__ = ["CTRMetric"]
