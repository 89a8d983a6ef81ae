"""The check both row-reset test files run: a batched lookup trained a step, then ``reset_rows`` (the
kernel interface's hook that managed-collision evictions call)."""

from __future__ import annotations

import torch

from lightrec.kernels.batched_embedding import BatchedEmbeddingBag


def check_reset_rows(backend: str, optimizer: str, device: torch.device) -> None:
    """Rows 1 and 4 of table 1 get new weights and zero per-row state; every other row and the
    kernel-wide state (Adam's step) are untouched."""
    bag = BatchedEmbeddingBag([(7, 4), (6, 8)], optimizer={"optimizer": optimizer, "learning_rate": 0.1},
                              kernel_backend=backend, device=device)  # fmt: skip
    indices = torch.tensor([0, 3, 6, 1, 4, 5, 2, 1], device=device)
    offsets = torch.tensor([0, 2, 3, 6, 8], device=device)  # 2 features x batch 2
    bag(indices, offsets).pow(2).sum().backward()
    before_w = [w.detach().clone() for w in bag.kernel.split_embedding_weights()]
    before_s = [{k: v.clone() for k, v in s.items()} for s in bag.kernel.split_optimizer_states()]
    rows = torch.tensor([1, 4], device=device)
    values = torch.arange(8.0, device=device).repeat(2, 1)
    bag.reset_rows("t1", rows, values)
    weights, states = bag.kernel.split_embedding_weights(), bag.kernel.split_optimizer_states()
    assert torch.equal(weights[1][rows], values) and torch.equal(weights[0], before_w[0])
    keep = torch.tensor([0, 2, 3, 5], device=device)
    assert torch.equal(weights[1][keep], before_w[1][keep])
    assert torch.equal(bag.weights["t1"].detach()[rows], values)  # the parameters alias the storage
    for name, state in states[1].items():
        if name == "step":
            assert torch.equal(state, before_s[1][name])
            continue
        assert bool((state[rows] == 0).all()) and torch.equal(state[keep], before_s[1][name][keep])
        assert bool((before_s[1][name][rows] != 0).any())  # there was state to reset
    for name, state in states[0].items():
        assert torch.equal(state, before_s[0][name])
