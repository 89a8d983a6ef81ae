"""torchrec's ``torchrec.metrics.mse``: ``MSEMetricComputation``, from :mod:`lightrec.metrics.regression`
(where lightrec's ``MSE`` metric lives too); torchrec's base classes are in
:mod:`lightrec.metrics.computation`."""

from lightrec.metrics.regression import MSEMetricComputation

__all__ = ["MSEMetricComputation"]
