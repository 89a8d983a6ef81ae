"""torchrec's ``torchrec.metrics.mae``: ``MAEMetric``, ``MAEMetricComputation``, from :mod:`lightrec.metrics.regression`
(where lightrec's ``MAE`` metric lives too); torchrec's base classes are in
:mod:`lightrec.metrics.computation`."""

from lightrec.metrics.regression import MAEMetric, MAEMetricComputation

__all__ = ["MAEMetric", "MAEMetricComputation"]
