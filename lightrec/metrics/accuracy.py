"""torchrec's ``torchrec.metrics.accuracy``: ``AccuracyMetric``, ``AccuracyMetricComputation``, from :mod:`lightrec.metrics.rates`
(where lightrec's ``Accuracy`` metric lives too); torchrec's base classes are in
:mod:`lightrec.metrics.computation`."""

from lightrec.metrics.rates import AccuracyMetric, AccuracyMetricComputation

__all__ = ["AccuracyMetric", "AccuracyMetricComputation"]
