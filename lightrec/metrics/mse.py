"""torchrec's ``torchrec.metrics.mse``: ``MSEMetric``, ``MSEMetricComputation``, from :mod:`lightrec.metrics.regression`
(where lightrec's ``MSE`` metric lives too); torchrec's base classes are in
:mod:`lightrec.metrics.computation`."""

from lightrec.metrics.regression import MSEMetric, MSEMetricComputation

__all__ = ["MSEMetric", "MSEMetricComputation"]
