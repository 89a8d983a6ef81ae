"""What the Triton kernels compile to on a Hopper GPU, without a GPU: registers, spills, load widths.

Compiles lightrec's Triton kernels for ``sm_90`` (H100/H200) with the launch settings the backend
uses for 128-wide fp32 rows, through Triton's own compiler (LLVM + the bundled ``ptxas``), and
reads the results: registers per thread and stack bytes (spills) from ``cuobjdump``, and how many
global loads/stores are 16-byte vectors (``ld.global.v4``) in the PTX. A memory-bound lookup wants
16-byte accesses and no spills; this prints them for every kernel variant (per optimizer, uniform
and mixed dims). Nothing here measures speed.

Run (any machine with triton; ``TRITON_INTERPRET`` must be unset)::

    python benchmarks/triton_kernel_report.py [--arch 90] [--out kernels_sm90.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: this report compiles the kernels for a GPU")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# Integer arguments Triton specializes as multiples of 16 at launch when they are (row strides of
# 128-wide outputs), and pointer arguments (16-byte aligned tensors).
_ALIGNED_INTS = ("out_stride", "grad_stride", "piece_stride")


def _compile(
    fn: Any, types: dict[str, str], constants: dict[str, Any], arch: int, num_warps: int
) -> dict[str, Any]:
    signature = {
        name: types.get(name, "constexpr" if name in constants else "*fp32") for name in fn.arg_names
    }
    aligned = [n for n in fn.arg_names if signature[n].startswith("*") or n in _ALIGNED_INTS]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})  # fmt: skip
    ptx = kernel.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "ld_global_v4": ptx.count("ld.global.v4"),
        "st_global_v4": ptx.count("st.global.v4"),
        "ld_global_scalar": len(re.findall(r"ld\.global(?:\.[a-z]+)*\.b(?:32|64|16|8) ", ptx)),
        "num_warps": num_warps,
    }


def report(arch: int) -> list[dict[str, Any]]:
    from lightrec.kernels import triton_kernels as k
    from lightrec.kernels.triton_backend import _launch_config
    from lightrec.quant.triton_quant_kernel import quant_pooled_kernel

    cfg = _launch_config(128)
    meta = {"feat_woff_ptr": "*i64", "feat_rows_ptr": "*i64", "feat_key_base_ptr": "*i64", "feat_dim_ptr": "*i32",
            "feat_col_ptr": "*i32"}  # fmt: skip
    fwd_types = {**meta, "indices_ptr": "*i64", "offsets_ptr": "*i64", "occ_key_ptr": "*i32", "occ_bag_ptr": "*i32",
                 "error_ptr": "*i32", "batch": "i32", "num_ids": "i32", "out_stride": "i32", "invalid_key": "i32"}  # fmt: skip
    rows = []
    for fixed in (128, 0):
        for meta_out in (True, False):
            consts = dict(FIXED_D=fixed, VEC=16, BLOCK_B=cfg.forward_block_b, BLOCK_D=128, POOLED=True, MEAN=False,
                          HAS_WEIGHTS=False, WRITE_META=meta_out, ACC=tl.float32)  # fmt: skip
            r = _compile(k.lookup_forward_kernel, fwd_types, consts, arch, cfg.num_warps)
            rows.append({"kernel": "lookup_forward", "dims": "uniform 128" if fixed else "mixed (max 128)",
                         "variant": "training (writes keys)" if meta_out else "inference", **r})  # fmt: skip
    bwd_types = {**meta, "keys_ptr": "*i32", "order_ptr": "*i64", "occ_bag_ptr": "*i32", "offsets_ptr": "*i64",
                 "in_feat_ptr": "*i32", "in_real_ptr": "*i8", "piece_key_ptr": "*i32", "piece_feat_ptr": "*i32",
                 "piece_real_ptr": "*i8", "adam_bias_ptr": "*fp64", "num_ids": "i32", "batch": "i32",
                 "grad_stride": "i32", "invalid_key": "i32", "steps": "i32", "piece_stride": "i32",
                 **{n: "fp32" for n in ("lr", "eps", "weight_decay", "decay_factor", "beta1", "one_minus_beta1",
                                        "beta2", "one_minus_beta2")}}  # fmt: skip
    names = {0: "dense grad", 1: "sgd", 2: "adagrad", 3: "row-wise adagrad", 4: "adam"}
    # Level 1 (GATHER: reads the output gradient) for every optimizer; the later levels (partial
    # sums of the level before) for two. float64 weights: the Adam level 1 with float64 arithmetic.
    variants = [(opt, fixed, True, "fp32") for opt in names for fixed in (128, 0)]
    variants += [(3, 128, False, "fp32"), (4, 128, False, "fp32"), (4, 128, True, "fp64")]
    for opt, fixed, gather, acc in variants:
        consts = dict(OPT=opt, WD_MODE=0, FIXED_D=fixed, VEC=16, BLOCK_N=cfg.backward_block_n, BLOCK_D=128,
                      POOLED=True, MEAN=False, HAS_WEIGHTS=False, GATHER=gather,
                      ACC=tl.float64 if acc == "fp64" else tl.float32)  # fmt: skip
        types = bwd_types if acc == "fp32" else {**bwd_types, **{n: "*fp64" for n in (
            "grad_ptr", "in_sum_ptr", "piece_sum_ptr", "weights_ptr", "dense_grad_ptr")}, "lr": "fp64"}  # fmt: skip
        r = _compile(k.lookup_backward_kernel, types, consts, arch, cfg.num_warps)
        level = "level 1" if gather else "levels 2+"
        rows.append({"kernel": "lookup_backward", "dims": "uniform 128" if fixed else "mixed (max 128)",
                     "variant": f"{names[opt]}, {level}" + (", float64" if acc == "fp64" else ""), **r})  # fmt: skip
    quant_types = {"flat_ptr": "*u8", "flat16_ptr": "*fp16", "meta_ptr": "*i64", "ids_ptr": "*i64",
                   "offsets_ptr": "*i64", "batch": "i32", "num_ids": "i32", "out_stride": "i32"}  # fmt: skip
    for align in (16, 1):  # the default row alignment; an odd one (fp16 values read bytewise)
        consts = dict(BLOCK_B=4, BLOCK_D=128, MEAN=False, HAS_WEIGHTS=False, VEC=4, ROW_ALIGN=align)
        rows.append({"kernel": "quant_pooled", "dims": "128", "variant": f"int8/int4/fp16, row_align {align}",
                     **_compile(quant_pooled_kernel, quant_types, consts, arch, 4)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = report(args.arch)
    print(f"sm_{args.arch}, triton {triton.__version__}\n")
    print(
        "| kernel | dims | variant | registers | stack bytes | 16-byte loads | 16-byte stores | scalar loads |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['kernel']} | {r['dims']} | {r['variant']} | {r['registers']} | {r['stack_bytes']} | "
              f"{r['ld_global_v4']} | {r['st_global_v4']} | {r['ld_global_scalar']} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": args.arch, "triton": triton.__version__, "kernels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
