"""Triton kernels of the ``triton`` lookup backend: one launch looks up every table of a group,
one launch sums the gradient of every touched row and applies the optimizer to it.

Imported only when a Triton backend is built (``@triton.jit`` reads ``TRITON_INTERPRET`` here,
when the kernels are defined). Storage, shared with :mod:`lightrec.kernels.triton_backend`::

    weights  [E]   every table back to back; table t starts at element woff[t] (a multiple of 16)
                   and holds rows[t] x dims[t] elements, row-major
    state1   [E]   Adagrad's sum / Adam's first moment (same layout as weights), or
             [R]   row-wise Adagrad's per-row sum, indexed by global row (R = sum of rows)
    state2   [E]   Adam's second moment

Per-feature tables (``[T]``, feature f reads table ftm[f]): ``feat_woff`` (int64 element offset),
``feat_rows`` (int64 rows), ``feat_key_base`` (int64 global row of the table's row 0),
``feat_dim`` (int32) and ``feat_col`` (int32 first output column).

Forward: program ``(i, f)`` pools bags ``f*B + i*BLOCK_B ..`` as a ``[BLOCK_B, BLOCK_D]`` tile
(one row load per bag per step, all bags of the tile in flight together), loops over bag positions
up to the longest bag of the tile, and for training also writes each id's *key* (its global row)
and its bag number. Bad ids and malformed offsets never read out of bounds: they are skipped and
raise the error flag (``error[0] = 1``), which the module reports (see ``input_checks``).

Backward (the "exact" rule: one update per row with its summed gradient): the host sorts the keys;
program ``i`` takes sorted positions ``[i*BLOCK_N, (i+1)*BLOCK_N)``, gathers each position's
gradient straight from the output gradient, and sums runs of equal keys with a segmented scan. A
program owns the runs that *start* in its tile; a run that continues past the tile's end is
finished by its owner reading the following tiles. Each owned run's row is then updated (or, for
``optimizer=None``, its summed gradient written to a dense gradient buffer). No ``[rows, D]`` and
no ``[N, D]`` buffer is ever written.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "OPT_ADAGRAD",
    "OPT_ADAM",
    "OPT_DENSE_GRAD",
    "OPT_ROWWISE_ADAGRAD",
    "OPT_SGD",
    "WD_DECOUPLED",
    "WD_L2",
    "WD_NONE",
    "lookup_backward_kernel",
    "lookup_forward_kernel",
]

# What the backward kernel does with each row's summed gradient (compile-time codes; the host
# passes ``.value``).
OPT_DENSE_GRAD = tl.constexpr(0)
OPT_SGD = tl.constexpr(1)
OPT_ADAGRAD = tl.constexpr(2)
OPT_ROWWISE_ADAGRAD = tl.constexpr(3)
OPT_ADAM = tl.constexpr(4)
WD_NONE = tl.constexpr(0)
WD_L2 = tl.constexpr(1)
WD_DECOUPLED = tl.constexpr(2)


# Sizes that change from batch to batch are not specialized on (a new batch size must not
# recompile); row strides are, so 16-byte alignment is known.
@triton.jit(do_not_specialize=["batch", "num_ids", "invalid_key"])
def lookup_forward_kernel(
    weights_ptr,
    indices_ptr,
    offsets_ptr,
    psw_ptr,
    out_ptr,
    feat_woff_ptr,
    feat_rows_ptr,
    feat_key_base_ptr,
    feat_dim_ptr,
    feat_col_ptr,
    occ_key_ptr,
    occ_bag_ptr,
    error_ptr,
    batch,
    num_ids,
    out_stride,
    invalid_key,
    FIXED_D: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    POOLED: tl.constexpr,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    WRITE_META: tl.constexpr,
    ACC: tl.constexpr,
):
    """Pooled ``out[B, total_D]`` (or unpooled ``out[N, D]``) of bags ``f*B + b`` for one feature ``f``.

    ``FIXED_D > 0``: every feature has that dim (feature f's columns start at ``f * FIXED_D``);
    else dims/columns come from ``feat_dim``/``feat_col`` and are multiples of ``VEC``.
    ``WRITE_META``: store ``occ_key[pos]`` (global row, or ``invalid_key`` for a bad id) and
    ``occ_bag[pos]`` for the backward.
    """
    f = tl.program_id(1)
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = b < batch
    bag = f.to(tl.int64) * batch + b
    last_bag = tl.num_programs(1).to(tl.int64) * batch - 1
    start = tl.load(offsets_ptr + bag, mask=in_batch, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=in_batch, other=0).to(tl.int64)
    # Malformed offsets must not make the kernel read outside indices: flag them and clamp.
    bad = in_batch & ((start < 0) | (end < start) | (end > num_ids))
    bad = bad | ((bag == 0) & (start != 0)) | (in_batch & (bag == last_bag) & (end != num_ids))
    start = tl.minimum(tl.maximum(start, 0), num_ids)
    end = tl.minimum(tl.maximum(end, start), num_ids)
    length = tl.where(in_batch, end - start, 0)

    if FIXED_D > 0:
        dim = FIXED_D
        col = f * FIXED_D
    else:
        # Hints: dims and column offsets are multiples of VEC, so rows load VEC elements at a time.
        dim = tl.multiple_of(tl.load(feat_dim_ptr + f), VEC)
        col = tl.multiple_of(tl.load(feat_col_ptr + f), VEC)
    woff = tl.multiple_of(tl.load(feat_woff_ptr + f), 16)
    rows = tl.load(feat_rows_ptr + f)
    key_base = tl.load(feat_key_base_ptr + f)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < dim

    acc = tl.zeros([BLOCK_B, BLOCK_D], dtype=ACC)
    for j in range(0, tl.max(length, axis=0)):
        active = j < length
        pos = start + j
        idx = tl.load(indices_ptr + pos, mask=active, other=0).to(tl.int64)
        ok = active & (idx >= 0) & (idx < rows)
        bad = bad | (active & (~ok))
        row = woff + idx * dim
        x = tl.load(
            weights_ptr + row[:, None] + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0
        ).to(ACC)
        if HAS_WEIGHTS:
            x = x * tl.load(psw_ptr + pos, mask=active, other=0.0).to(ACC)[:, None]
        if POOLED:
            acc += x
        else:
            dst = out_ptr + pos[:, None] * out_stride + cols[None, :]
            tl.store(dst, x.to(out_ptr.dtype.element_ty), mask=active[:, None] & col_ok[None, :])
        if WRITE_META:
            key = tl.where(ok, key_base + idx, invalid_key)
            tl.store(occ_key_ptr + pos, key.to(occ_key_ptr.dtype.element_ty), mask=active)
            tl.store(occ_bag_ptr + pos, bag.to(tl.int32), mask=active)

    if POOLED:
        if MEAN:
            acc = tl.div_rn(acc, tl.maximum(length, 1).to(ACC)[:, None])
        dst = out_ptr + b[:, None] * out_stride + col + cols[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=in_batch[:, None] & col_ok[None, :])
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        tl.store(error_ptr, 1)


@triton.jit
def _segment_add(flag_a, value_a, flag_b, value_b):
    """Combine of a segmented sum: a run restarts where ``flag`` (a run start) is set."""
    return flag_a | flag_b, tl.where(flag_b, value_b, value_a + value_b)


@triton.jit
def _gather_contributions(
    pos,
    take,
    cols,
    order_ptr,
    occ_bag_ptr,
    offsets_ptr,
    psw_ptr,
    grad_ptr,
    feat_dim_ptr,
    feat_col_ptr,
    batch,
    grad_stride,
    FIXED_D: tl.constexpr,
    VEC: tl.constexpr,
    POOLED: tl.constexpr,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    ACC: tl.constexpr,
):
    """``[BLOCK_N, BLOCK_D]`` gradient of the ids at sorted positions ``pos`` (rows not ``take``: 0).

    Returns the contributions and each position's feature ``f``.
    """
    occ = tl.load(order_ptr + pos, mask=take, other=0)
    bag = tl.load(occ_bag_ptr + occ, mask=take, other=0).to(tl.int64)
    f = bag // batch
    if FIXED_D > 0:
        col = f * FIXED_D
        col_ok = cols[None, :] < FIXED_D
    else:
        dim = tl.multiple_of(tl.load(feat_dim_ptr + f, mask=take, other=VEC), VEC)
        col = tl.multiple_of(tl.load(feat_col_ptr + f, mask=take, other=0), VEC)
        col_ok = cols[None, :] < dim[:, None]
    if POOLED:
        src = (bag - f * batch) * grad_stride + col
    else:
        src = occ * grad_stride
    g = tl.load(grad_ptr + src[:, None] + cols[None, :], mask=take[:, None] & col_ok, other=0.0).to(ACC)
    if MEAN:
        lo = tl.load(offsets_ptr + bag, mask=take, other=0)
        hi = tl.load(offsets_ptr + bag + 1, mask=take, other=1)
        scale = tl.div_rn(tl.full(lo.shape, 1.0, ACC), tl.maximum(hi - lo, 1).to(ACC))
        if HAS_WEIGHTS:
            scale = scale * tl.load(psw_ptr + occ, mask=take, other=0.0).to(ACC)
        g = g * scale[:, None]
    elif HAS_WEIGHTS:
        g = g * tl.load(psw_ptr + occ, mask=take, other=0.0).to(ACC)[:, None]
    return g, f


@triton.jit(do_not_specialize=["num_ids", "batch", "invalid_key"])
def lookup_backward_kernel(
    sorted_keys_ptr,
    order_ptr,
    occ_bag_ptr,
    offsets_ptr,
    psw_ptr,
    grad_ptr,
    weights_ptr,
    state1_ptr,
    state2_ptr,
    dense_grad_ptr,
    feat_woff_ptr,
    feat_key_base_ptr,
    feat_dim_ptr,
    feat_col_ptr,
    adam_bias_ptr,
    num_ids,
    batch,
    grad_stride,
    invalid_key,
    lr,
    eps,
    weight_decay,
    decay_factor,
    beta1,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    OPT: tl.constexpr,
    WD_MODE: tl.constexpr,
    FIXED_D: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    POOLED: tl.constexpr,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    ACC: tl.constexpr,
):
    """Sum the gradient of every run of equal sorted keys and update that row once (see module doc).

    ``decay_factor`` is ``1 - lr * weight_decay`` (decoupled decay), ``one_minus_beta*`` are
    ``1 - beta*`` computed in double on the host, ``adam_bias`` holds ``[1 - b1^t, 1 - b2^t]``.
    """
    r = tl.arange(0, BLOCK_N)
    tile = tl.program_id(0).to(tl.int64) * BLOCK_N
    pos = tile + r
    in_range = pos < num_ids
    key = tl.load(sorted_keys_ptr + pos, mask=in_range, other=invalid_key).to(tl.int64)
    prev = tl.load(sorted_keys_ptr + pos - 1, mask=in_range & (pos > 0), other=-1).to(tl.int64)
    after = tl.load(sorted_keys_ptr + pos + 1, mask=(pos + 1) < num_ids, other=-1).to(tl.int64)
    valid = in_range & (key != invalid_key)  # bad ids sort last under invalid_key; they update nothing
    is_start = valid & (key != prev)
    # Positions before the tile's first run start continue a run owned by an earlier tile.
    first_start = tl.min(tl.where(is_start, r, BLOCK_N), axis=0)
    if first_start < BLOCK_N:
        cols = tl.arange(0, BLOCK_D)
        g, f = _gather_contributions(
            pos, valid, cols, order_ptr, occ_bag_ptr, offsets_ptr, psw_ptr, grad_ptr, feat_dim_ptr,
            feat_col_ptr, batch, grad_stride, FIXED_D, VEC, POOLED, MEAN, HAS_WEIGHTS, ACC,
        )  # fmt: skip
        flags = tl.broadcast_to(is_start[:, None], (BLOCK_N, BLOCK_D))
        summed = tl.associative_scan((flags, g), 0, _segment_add)[1]
        is_end = valid & (key != after)
        # The tile's last valid position may continue into the next tiles: its owner sums them.
        last = tl.max(tl.where(valid, r, -1), axis=0)
        last_key = tl.max(tl.where(r == last, key, -1), axis=0)
        last_is_end = tl.max(tl.where(r == last, is_end, False).to(tl.int32), axis=0) > 0
        tail = tl.zeros([BLOCK_D], dtype=ACC)
        more = (last >= first_start) & (~last_is_end)
        next_tile = tile + BLOCK_N
        while more:
            nxt = next_tile + r
            same = (nxt < num_ids) & (
                tl.load(sorted_keys_ptr + nxt, mask=nxt < num_ids, other=-1).to(tl.int64) == last_key
            )
            g_next, _unused_f = _gather_contributions(
                nxt, same, cols, order_ptr, occ_bag_ptr, offsets_ptr, psw_ptr, grad_ptr, feat_dim_ptr,
                feat_col_ptr, batch, grad_stride, FIXED_D, VEC, POOLED, MEAN, HAS_WEIGHTS, ACC,
            )  # fmt: skip
            tail += tl.sum(g_next, axis=0)
            more = tl.sum(same.to(tl.int32), axis=0) == BLOCK_N
            next_tile += BLOCK_N
        is_last = r == last
        summed = tl.where(is_last[:, None], summed + tail[None, :], summed)
        update = valid & (r >= first_start) & (is_end | is_last)
        _apply_rows(
            summed, update, key, f, cols, weights_ptr, state1_ptr, state2_ptr, dense_grad_ptr, feat_woff_ptr,
            feat_key_base_ptr, feat_dim_ptr, adam_bias_ptr, lr, eps, weight_decay, decay_factor, beta1,
            one_minus_beta1, beta2, one_minus_beta2, OPT, WD_MODE, FIXED_D, VEC, ACC,
        )  # fmt: skip


@triton.jit
def _apply_rows(
    g,
    update,
    key,
    f,
    cols,
    weights_ptr,
    state1_ptr,
    state2_ptr,
    dense_grad_ptr,
    feat_woff_ptr,
    feat_key_base_ptr,
    feat_dim_ptr,
    adam_bias_ptr,
    lr,
    eps,
    weight_decay,
    decay_factor,
    beta1,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    OPT: tl.constexpr,
    WD_MODE: tl.constexpr,
    FIXED_D: tl.constexpr,
    VEC: tl.constexpr,
    ACC: tl.constexpr,
):
    """Apply the optimizer to the rows ``key`` where ``update`` with their summed gradients ``g``.

    The formulas and their operation order are those of ``lightrec.kernels.sparse_update``
    (IEEE division and square root, as torch computes them).
    """
    woff = tl.load(feat_woff_ptr + f, mask=update, other=0)
    local = key - tl.load(feat_key_base_ptr + f, mask=update, other=0)
    if FIXED_D > 0:
        dim = tl.full(key.shape, FIXED_D, tl.int64)
        col_ok = cols[None, :] < FIXED_D
    else:
        dim = tl.multiple_of(tl.load(feat_dim_ptr + f, mask=update, other=VEC).to(tl.int64), VEC)
        col_ok = cols[None, :] < dim[:, None]
    at = tl.multiple_of(woff + local * dim, VEC)[:, None] + cols[None, :]
    mask = update[:, None] & col_ok
    if OPT == OPT_DENSE_GRAD:
        tl.store(dense_grad_ptr + at, g.to(dense_grad_ptr.dtype.element_ty), mask=mask)
    else:
        w = tl.load(weights_ptr + at, mask=mask, other=0.0).to(ACC)
        if WD_MODE == WD_L2:
            g = g + weight_decay * w
        if OPT == OPT_SGD:
            step = lr * g
        elif OPT == OPT_ADAGRAD:
            s = tl.load(state1_ptr + at, mask=mask, other=0.0).to(ACC) + g * g
            tl.store(state1_ptr + at, s.to(state1_ptr.dtype.element_ty), mask=mask)
            step = tl.div_rn(lr * g, tl.sqrt_rn(s) + eps)
        elif OPT == OPT_ROWWISE_ADAGRAD:
            mean_sq = tl.div_rn(tl.sum(g * g, axis=1), dim.to(ACC))
            m = tl.load(state1_ptr + key, mask=update, other=0.0).to(ACC) + mean_sq
            tl.store(state1_ptr + key, m.to(state1_ptr.dtype.element_ty), mask=update)
            step = tl.div_rn(tl.full(m.shape, lr, ACC), tl.sqrt_rn(m) + eps)[:, None] * g
        else:  # OPT_ADAM
            bias1 = tl.load(adam_bias_ptr).to(ACC)
            bias2 = tl.load(adam_bias_ptr + 1).to(ACC)
            m1 = tl.load(state1_ptr + at, mask=mask, other=0.0).to(ACC) * beta1 + one_minus_beta1 * g
            m2 = tl.load(state2_ptr + at, mask=mask, other=0.0).to(ACC) * beta2 + one_minus_beta2 * (g * g)
            tl.store(state1_ptr + at, m1.to(state1_ptr.dtype.element_ty), mask=mask)
            tl.store(state2_ptr + at, m2.to(state2_ptr.dtype.element_ty), mask=mask)
            step = tl.div_rn(lr * tl.div_rn(m1, bias1), tl.sqrt_rn(tl.div_rn(m2, bias2)) + eps)
        if WD_MODE == WD_DECOUPLED:
            w = w * decay_factor
        tl.store(weights_ptr + at, (w - step).to(weights_ptr.dtype.element_ty), mask=mask)
