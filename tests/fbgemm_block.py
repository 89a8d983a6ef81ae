"""A meta-path finder that makes ``fbgemm_gpu`` unimportable, as on a machine without a wheel."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _BlockFbgemm(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname == "fbgemm_gpu" or fullname.startswith("fbgemm_gpu."):
            raise ImportError(f"{fullname} is blocked (LIGHTREC_BLOCK_FBGEMM=1)")
        return None


def install_fbgemm_block() -> None:
    """Block ``fbgemm_gpu`` for this process; fails loudly if it was already imported."""
    if any(isinstance(f, _BlockFbgemm) for f in sys.meta_path):
        return
    if "fbgemm_gpu" in sys.modules:
        raise RuntimeError("fbgemm_gpu was imported before the block could be installed")
    sys.meta_path.insert(0, _BlockFbgemm())
