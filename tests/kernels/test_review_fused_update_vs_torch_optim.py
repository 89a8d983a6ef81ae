"""The fused sparse update against the torch optimizer it stands for, with repeated ids (review).

Every step's ids touch every row, several of them more than once, so the dense torch optimizer on
the summed gradient (``index_add`` of each occurrence) is the exact reference: fbgemm's "exact"
optimizers update a row once with the sum of its contributions. Both the stock-op update
(``apply_sparse_update``) and the native CPU pass (``native_fused_update``) are checked over
several steps, then a step touching a subset must leave the other rows and their state alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec.kernels.cpu_update import native_fused_update, native_update_available, new_scratch
from lightrec.kernels.sparse_update import apply_sparse_update
from lightrec.optim import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB, RowWiseAdagrad
from lightrec.optim.fused_spec import optimizer_class_to_spec

_CASES: list[tuple[type, dict[str, Any]]] = [
    (torch.optim.SGD, {"lr": 0.3}),
    (torch.optim.SGD, {"lr": 0.3, "weight_decay": 0.1}),
    (torch.optim.Adagrad, {"lr": 0.2}),
    (torch.optim.Adagrad, {"lr": 0.2, "weight_decay": 0.05, "eps": 1e-6}),
    (RowWiseAdagrad, {"lr": 0.2, "weight_decay": 0.05}),
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.Adam, {"lr": 0.05, "weight_decay": 0.1, "betas": (0.8, 0.95)}),
    (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    (LAMB, {"lr": 0.05, "weight_decay": 0.01}),
    (PartialRowWiseAdam, {"lr": 0.05}),
    (PartialRowWiseLAMB, {"lr": 0.05, "weight_decay": 0.01}),
    (LarsSGD, {"lr": 0.1, "weight_decay": 0.01}),
]
# every row at least once, rows 0 and 2 several times
_STEPS = [[0, 2, 2, 4, 0, 0, 1, 3], [4, 3, 2, 1, 0, 2], [1, 1, 1, 0, 2, 3, 4, 4]]
_SUBSET = [1, 3, 3]


def _fused_step(path: str, spec: Any, lr: float, t: int, w: torch.Tensor, states: dict[str, torch.Tensor],
                ids: torch.Tensor, contrib: torch.Tensor) -> None:  # fmt: skip
    if path == "stock":
        apply_sparse_update(spec, lr, torch.tensor(t), w, states, ids, contrib)
    else:
        native_fused_update(spec, lr, torch.tensor(t), w, states, new_scratch(w.shape[0]), ids, contrib.unsqueeze(1),
                            None, None)  # fmt: skip


@pytest.mark.parametrize("path", ["stock", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("cls", "kwargs"), _CASES, ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_fused_update_with_repeated_ids_matches_the_torch_optimizer(
    cls: type, kwargs: dict[str, Any], dtype: torch.dtype, path: str
) -> None:
    spec = optimizer_class_to_spec(cls, kwargs)
    if path == "native" and (spec.optimizer.name not in ("SGD", "ADAGRAD", "ROWWISE_ADAGRAD", "ADAM")
                             or not native_update_available(torch.device("cpu"), dtype)):  # fmt: skip
        pytest.skip("the native pass does not serve this optimizer / is not built")
    g = torch.Generator().manual_seed(3)
    init = torch.randn(5, 4, generator=g, dtype=dtype)
    ref = torch.nn.Parameter(init.clone())
    opt = cls([ref], **kwargs)
    w = init.clone()
    states = {n: torch.zeros(spec.state_shape(n, 5, 4), dtype=dtype) for n in spec.state_names}
    for t, step_ids in enumerate(_STEPS, start=1):
        ids = torch.tensor(step_ids)
        contrib = torch.randn(ids.numel(), 4, generator=g, dtype=dtype)
        ref.grad = torch.zeros_like(ref).index_add_(0, ids, contrib)
        opt.step()
        _fused_step(path, spec, float(kwargs["lr"]), t, w, states, ids, contrib)
        tol = 1e-5 if dtype == torch.float32 else 1e-11
        torch.testing.assert_close(w, ref.detach(), atol=tol, rtol=tol, msg=f"step {t}")
    # a step touching rows 1 and 3 only: the others and their state stay as they were
    before_w, before_s = w.clone(), {n: s.clone() for n, s in states.items()}
    ids = torch.tensor(_SUBSET)
    _fused_step(path, spec, float(kwargs["lr"]), len(_STEPS) + 1, w, states, ids, torch.ones(3, 4, dtype=dtype))
    for r in (0, 2, 4):
        assert torch.equal(w[r], before_w[r])
        for n, s in states.items():
            assert torch.equal(s[r], before_s[n][r])
    assert not torch.equal(w[1], before_w[1]) and not torch.equal(w[3], before_w[3])
