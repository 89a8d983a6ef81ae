"""``lightrec.optim.apply_optimizer_in_backward`` is both torchrec's submodule path and the function the
package exports: importing the submodule must not replace the function (RecModule calls it)."""

from __future__ import annotations

import importlib


def test_importing_the_submodule_path_keeps_the_packages_function() -> None:
    import lightrec.optim
    from lightrec.optim.in_backward import apply_optimizer_in_backward

    module = importlib.import_module("lightrec.optim.apply_optimizer_in_backward")
    assert module.apply_optimizer_in_backward is apply_optimizer_in_backward
    assert lightrec.optim.apply_optimizer_in_backward is apply_optimizer_in_backward
