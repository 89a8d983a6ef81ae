"""Hypothesis strategies for random jagged batches."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


@st.composite
def kjts(draw, max_keys: int = 5, max_batch: int = 6, max_len: int = 4, weighted: bool | None = None):
    """A random, valid KeyedJaggedTensor (possibly with empty bags, a zero batch or weights)."""
    from lightrec.sparse import KeyedJaggedTensor

    num_keys = draw(st.integers(1, max_keys))
    batch = draw(st.integers(0, max_batch))
    lengths = draw(st.lists(st.integers(0, max_len), min_size=num_keys * batch, max_size=num_keys * batch))
    total = sum(lengths)
    values = draw(st.lists(st.integers(0, 1000), min_size=total, max_size=total))
    is_weighted = draw(st.booleans()) if weighted is None else weighted
    weights = torch.rand(total, generator=torch.Generator().manual_seed(total)) if is_weighted else None
    return KeyedJaggedTensor(
        keys=[f"f{i}" for i in range(num_keys)],
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=weights,
        stride=batch,
    )


def kjt_as_lists(kjt) -> dict[str, list[list[int]]]:
    """``{key: [[ids of sample 0], ...]}`` — an independent reading of a KJT for comparisons."""
    out: dict[str, list[list[int]]] = {}
    lengths = kjt.lengths().tolist()
    values = kjt.values().tolist()
    weights = kjt.weights_or_none()
    wl = weights.tolist() if weights is not None else None
    pos = 0
    b = kjt.stride()
    for k, key in enumerate(kjt.keys()):
        rows = []
        for s in range(b):
            n = lengths[k * b + s]
            rows.append(
                [(values[i], wl[i]) if wl is not None else values[i] for i in range(pos, pos + n)]
            )
            pos += n
        out[key] = rows
    return out
