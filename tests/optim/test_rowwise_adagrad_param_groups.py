"""``RowWiseAdagrad.add_param_group``: a group added after construction (Lightning's
``BackboneFinetuning`` unfreezes layers this way) gets its zero ``"sum"`` state, steps by the
row-wise rule and is checkpointed like the groups given to ``__init__``.

Before: only ``__init__``'s groups had a ``"sum"``; the first ``step`` with the added group raised
``KeyError: 'sum'``.
"""

from __future__ import annotations

import torch

from lightrec.optim import RowWiseAdagrad


def test_added_param_group_has_state_and_steps_by_the_rowwise_rule() -> None:
    first = torch.nn.Parameter(torch.randn(3, 4))
    added = torch.nn.Parameter(torch.randn(5, 4))
    start = added.detach().clone()
    opt = RowWiseAdagrad([first], lr=0.1)
    opt.add_param_group({"params": [added], "lr": 0.5})
    assert torch.equal(opt.state[added]["sum"], torch.zeros(5))

    grad = torch.randn(5, 4)
    added.grad = grad.clone()
    first.grad = torch.ones(3, 4)
    opt.step()

    momentum = grad.square().mean(dim=1)
    torch.testing.assert_close(opt.state[added]["sum"], momentum)
    torch.testing.assert_close(added.detach(), start - 0.5 * grad / (momentum.sqrt() + 1e-10).unsqueeze(1))
    assert len(opt.state_dict()["state"]) == 2
