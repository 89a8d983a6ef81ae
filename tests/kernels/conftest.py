"""Fixtures of the kernel tests: ``tiles`` (launch-tile sizes of the Triton kernels)."""

from tests.triton_support import tiles  # noqa: F401  (a fixture, found by name)
