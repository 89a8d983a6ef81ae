"""torchrec's ``torchrec.metrics.calibration``: ``CalibrationMetric``, from :mod:`lightrec.metrics.rates`
(where lightrec's ``Calibration`` metric lives too)."""

from lightrec.metrics.rates import CalibrationMetric

__all__ = ["CalibrationMetric"]
