"""The devices the core tests run on: ``cpu`` always, ``cuda`` as an opt-in ``gpu`` case.

Use the ``device`` fixture (tests/conftest.py) in ordinary tests, or ``DEVICES`` directly in
``pytest.mark.parametrize`` (hypothesis tests, which must not take function-scoped fixtures). The
``cuda`` cases carry the ``gpu`` mark: the default run deselects them (``-m 'not gpu'`` in
pyproject.toml), ``-m gpu`` selects them, and without a CUDA device they are skipped (conftest).
"""

from __future__ import annotations

import pytest

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
