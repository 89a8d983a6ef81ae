"""Every private Lightning import lightrec relies on, in one place.

Lightning moves private helpers between minor releases; when it does, this is the only file to
change. Public Lightning API is imported directly where it is used.
"""

from __future__ import annotations

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.optimizer import _optimizers_to_device as optimizers_to_device

__all__ = ["default_pg_timeout", "optimizers_to_device"]
