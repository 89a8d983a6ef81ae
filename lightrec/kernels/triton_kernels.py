"""Triton kernels of the ``triton`` lookup backend: one launch looks up every table of a group,
one launch per level of a segmented reduction sums the gradient of every touched row and applies
the optimizer to it.

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
and its bag number. Bad ids and malformed offsets never read out of bounds: bad ids are skipped,
offsets are clamped, and both raise the error flag (``error[0] = 1``), which the module reports (see
``input_checks``). Positions that lie in no bag (malformed offsets) keep the key the host filled in,
``invalid_key``, so the backward skips them.

Backward (the "exact" rule: one update per row with its summed gradient), a segmented reduction
over the host-sorted keys in *levels*. At level 1, program ``p`` takes ``steps`` tiles of
``BLOCK_N`` sorted positions, gathers each position's gradient straight from the output gradient
and sums runs of equal keys with a segmented scan, carrying the open run from tile to tile. A run
that starts and ends inside the program is complete: its row is updated at once (or, for
``optimizer=None``, its summed gradient written to a dense gradient buffer). A run that crosses the
program's first or last position is not: the program writes its partial sum as a *piece*, two
slots per program::

    slot 2p     head piece: the run continuing from program p-1 (its sum inside p), or a pad
    slot 2p+1   tail piece: the run continuing into program p+1 (its sum inside p), or a pad

Pieces (key, feature, "real" flag, [D] partial sum) are sorted by key like the positions, so the
next level is the same reduction over ``2 * programs`` entries whose values are read densely; pads
carry a neighbour's key, no value and ``real = 0`` (a run made of pads only updates nothing). The
host launches levels until one program covers everything. A hot id (one key in half the batch)
therefore costs what spread ids cost: every program does ``steps`` tiles, whatever the keys, and
each level shrinks the problem ``steps * BLOCK_N / 2`` times. No ``[rows, D]`` and no ``[N, D]``
buffer is written; pieces take ``2 * D`` values per program.
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


@triton.jit
def _div(a, b, ACC: tl.constexpr):
    """IEEE-rounded ``a / b`` in ``ACC``: ``div_rn`` for float32 (``/`` is approximate there, and
    ``div_rn`` takes float32 only); plain ``/`` for float64, which is already ``div.rn.f64``."""
    if ACC == tl.float64:
        return a / b
    else:
        return tl.div_rn(a, b)


@triton.jit
def _sqrt(x, ACC: tl.constexpr):
    """IEEE-rounded square root in ``ACC`` (``sqrt_rn`` is float32 only; float64 ``sqrt`` is exact)."""
    if ACC == tl.float64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


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
            acc = _div(acc, tl.maximum(length, 1).to(ACC)[:, None], ACC)
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
        scale = _div(tl.full(lo.shape, 1.0, ACC), tl.maximum(hi - lo, 1).to(ACC), ACC)
        if HAS_WEIGHTS:
            scale = scale * tl.load(psw_ptr + occ, mask=take, other=0.0).to(ACC)
        g = g * scale[:, None]
    elif HAS_WEIGHTS:
        g = g * tl.load(psw_ptr + occ, mask=take, other=0.0).to(ACC)[:, None]
    return g, f


@triton.jit(do_not_specialize=["num_ids", "batch", "invalid_key", "steps"])
def lookup_backward_kernel(
    keys_ptr,
    order_ptr,
    occ_bag_ptr,
    offsets_ptr,
    psw_ptr,
    grad_ptr,
    in_feat_ptr,
    in_real_ptr,
    in_sum_ptr,
    piece_key_ptr,
    piece_feat_ptr,
    piece_real_ptr,
    piece_sum_ptr,
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
    steps,
    piece_stride,
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
    GATHER: tl.constexpr,
    ACC: tl.constexpr,
):
    """One level of the backward's segmented reduction (see the module doc).

    ``keys [num_ids]`` are sorted (``invalid_key`` and above: nothing to update). ``GATHER`` (level
    1): each position's gradient comes from ``grad`` through ``order``/``occ_bag``; otherwise
    (levels 2+) the positions are the previous level's pieces (``in_feat``, ``in_real``,
    ``in_sum [num_ids, piece_stride]``). Writes this level's pieces to ``piece_*`` (slots ``2p``,
    ``2p + 1``). ``decay_factor`` is ``1 - lr * weight_decay`` (decoupled decay), ``one_minus_beta*``
    are ``1 - beta*`` computed in double on the host, ``adam_bias`` holds ``[1 - b1^t, 1 - b2^t]``.
    """
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    piece_cols = cols < piece_stride
    base = pid * steps * BLOCK_N  # < num_ids: the host sizes the grid so
    # What a pad in the head slot carries: the program's first key and its feature (any feature
    # of the key's table will do; garbage only for a bad id, whose pads never update anything).
    first_key = tl.load(keys_ptr + base).to(tl.int64)
    if GATHER:
        first_feat = tl.load(occ_bag_ptr + tl.load(order_ptr + base)).to(tl.int64) // batch
    else:
        first_feat = tl.load(in_feat_ptr + base).to(tl.int64)
    last_key = tl.zeros([], tl.int64) + invalid_key
    last_feat = tl.zeros([], tl.int64)
    # The run open after the tiles seen so far: its partial sum, its count of real entries, whether
    # it started in this program ("mine"), and whether there is one.
    open_sum = tl.zeros([BLOCK_D], dtype=ACC)
    open_real = tl.zeros([], tl.int32)
    open_mine = tl.zeros([], tl.int32)
    is_open = tl.zeros([], tl.int32)
    head_done = tl.zeros([], tl.int32)
    for s in range(0, steps):
        pos = base + s * BLOCK_N + r
        in_range = pos < num_ids
        key = tl.load(keys_ptr + pos, mask=in_range, other=invalid_key).to(tl.int64)
        prev = tl.load(keys_ptr + pos - 1, mask=in_range & (pos > 0), other=-1).to(tl.int64)
        after = tl.load(keys_ptr + pos + 1, mask=(pos + 1) < num_ids, other=-1).to(tl.int64)
        # Keys are sorted, so this range check only trims the tail of bad ids (and, defensively,
        # anything else outside the rows; the host fills positions no bag covers with invalid_key).
        valid = in_range & (key >= 0) & (key < invalid_key)
        is_start = valid & (key != prev)
        is_end = valid & (key != after)
        if GATHER:
            g, f = _gather_contributions(
                pos, valid, cols, order_ptr, occ_bag_ptr, offsets_ptr, psw_ptr, grad_ptr, feat_dim_ptr,
                feat_col_ptr, batch, grad_stride, FIXED_D, VEC, POOLED, MEAN, HAS_WEIGHTS, ACC,
            )  # fmt: skip
            real = valid
        else:
            f = tl.load(in_feat_ptr + pos, mask=valid, other=0).to(tl.int64)
            real = valid & (tl.load(in_real_ptr + pos, mask=valid, other=0) != 0)
            src = in_sum_ptr + pos[:, None] * piece_stride + cols[None, :]
            g = tl.load(src, mask=real[:, None] & piece_cols[None, :], other=0.0).to(ACC)
        flags = tl.broadcast_to(is_start[:, None], (BLOCK_N, BLOCK_D))
        summed = tl.associative_scan((flags, g), 0, _segment_add)[1]
        n_real = tl.associative_scan((is_start, real.to(tl.int32)), 0, _segment_add)[1]
        # Positions before the tile's first run start continue the open run.
        first_start = tl.min(tl.where(is_start, r, BLOCK_N), axis=0)
        cont = valid & (r < first_start)
        summed = tl.where(cont[:, None], summed + open_sum[None, :], summed)
        n_real = tl.where(cont, n_real + open_real, n_real)
        mine = tl.where(cont, open_mine, 1) != 0
        # A run that ends here and started in this program is complete: update its row now.
        update = is_end & mine & (n_real > 0)
        _apply_rows(
            summed, update, key, f, cols, weights_ptr, state1_ptr, state2_ptr, dense_grad_ptr, feat_woff_ptr,
            feat_key_base_ptr, feat_dim_ptr, adam_bias_ptr, lr, eps, weight_decay, decay_factor, beta1,
            one_minus_beta1, beta2, one_minus_beta2, OPT, WD_MODE, FIXED_D, VEC, ACC,
        )  # fmt: skip
        # The run that came from the previous program ends here (at most once): the head piece.
        head_end = is_end & (~mine)
        head = 2 * pid + r * 0
        has_sum = head_end & (n_real > 0)
        tl.store(piece_key_ptr + head, key.to(piece_key_ptr.dtype.element_ty), mask=head_end)
        tl.store(piece_feat_ptr + head, f.to(tl.int32), mask=head_end)
        tl.store(piece_real_ptr + head, has_sum.to(tl.int8), mask=head_end)
        dst = piece_sum_ptr + head[:, None] * piece_stride + cols[None, :]
        tl.store(dst, summed.to(piece_sum_ptr.dtype.element_ty), mask=has_sum[:, None] & piece_cols[None, :])
        head_done = head_done | tl.max(head_end.to(tl.int32), axis=0)
        # Carry the run of the tile's last valid position into the next tile (if it goes on).
        last = tl.max(tl.where(valid, r, -1), axis=0)
        if last >= 0:
            at_last = r == last
            last_key = tl.sum(tl.where(at_last, key, 0), axis=0)
            last_feat = tl.sum(tl.where(at_last, f, 0), axis=0)
            is_open = 1 - tl.max(tl.where(at_last, is_end, False).to(tl.int32), axis=0)
            open_sum = tl.sum(tl.where(at_last[:, None], summed, 0.0), axis=0) * is_open.to(ACC)
            open_real = tl.sum(tl.where(at_last, n_real, 0), axis=0) * is_open
            open_mine = tl.sum(tl.where(at_last, mine.to(tl.int32), 0), axis=0)
    # The run still open at the program's end goes on in the next program: it is the tail piece
    # when it started here; else the whole program lies inside one run, which is the head piece.
    open_here = (is_open != 0) & (open_mine != 0)
    open_before = (is_open != 0) & (open_mine == 0)
    tail = 2 * pid + 1
    tl.store(piece_key_ptr + tail, last_key.to(piece_key_ptr.dtype.element_ty))
    tl.store(piece_feat_ptr + tail, last_feat.to(tl.int32))
    tl.store(piece_real_ptr + tail, (open_here & (open_real > 0)).to(tl.int8))
    sum_dst = piece_sum_ptr + tail * piece_stride + cols
    # (cols * 0 + flag != 0: a per-column copy of a scalar condition; Triton's interpreter rejects
    # a mask made by broadcasting a scalar bool)
    has_sum = (cols * 0 + (open_here & (open_real > 0)).to(tl.int32)) != 0
    tl.store(sum_dst, open_sum.to(piece_sum_ptr.dtype.element_ty), mask=piece_cols & has_sum)
    if head_done == 0:
        head_key = tl.where(open_before, last_key, first_key)
        tl.store(piece_key_ptr + 2 * pid, head_key.to(piece_key_ptr.dtype.element_ty))
        tl.store(piece_feat_ptr + 2 * pid, tl.where(open_before, last_feat, first_feat).to(tl.int32))
        tl.store(piece_real_ptr + 2 * pid, (open_before & (open_real > 0)).to(tl.int8))
        has_sum = (cols * 0 + (open_before & (open_real > 0)).to(tl.int32)) != 0
        tl.store(sum_dst - piece_stride, open_sum.to(piece_sum_ptr.dtype.element_ty), mask=piece_cols & has_sum)


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
            step = _div(lr * g, _sqrt(s, ACC) + eps, ACC)
        elif OPT == OPT_ROWWISE_ADAGRAD:
            mean_sq = _div(tl.sum(g * g, axis=1), dim.to(ACC), ACC)
            m = tl.load(state1_ptr + key, mask=update, other=0.0).to(ACC) + mean_sq
            tl.store(state1_ptr + key, m.to(state1_ptr.dtype.element_ty), mask=update)
            step = _div(tl.full(m.shape, lr, ACC), _sqrt(m, ACC) + eps, ACC)[:, None] * g
        else:  # OPT_ADAM
            bias1 = tl.load(adam_bias_ptr).to(ACC)
            bias2 = tl.load(adam_bias_ptr + 1).to(ACC)
            m1 = tl.load(state1_ptr + at, mask=mask, other=0.0).to(ACC) * beta1 + one_minus_beta1 * g
            m2 = tl.load(state2_ptr + at, mask=mask, other=0.0).to(ACC) * beta2 + one_minus_beta2 * (g * g)
            tl.store(state1_ptr + at, m1.to(state1_ptr.dtype.element_ty), mask=mask)
            tl.store(state2_ptr + at, m2.to(state2_ptr.dtype.element_ty), mask=mask)
            step = _div(lr * _div(m1, bias1, ACC), _sqrt(_div(m2, bias2, ACC), ACC) + eps, ACC)
        if WD_MODE == WD_DECOUPLED:
            w = w * decay_factor
        tl.store(weights_ptr + at, (w - step).to(weights_ptr.dtype.element_ty), mask=mask)
