"""What checkpoint integrity costs, and how ``torch.distributed.checkpoint`` (DCP) compares.

Input: a sharded checkpoint folder -- the main job's, made by::

    lightrec run dlrm --devices 2 --trainer.max_steps=20 --recipe.export=false \\
        --recipe.test_after_fit=false --trainer.logger.init_args.save_dir=/tmp/main
    python benchmarks/bench_checkpoint.py /tmp/main/dlrm/version_0/checkpoints/last.ckpt

For every file of the folder (its payload loaded once), ``--repeats`` times, in alternating order:

* ``save plain``: ``torch.save`` to a file + ``fsync`` (what lightrec did before checksums);
* ``save hashed``: ``integrity.save_hashed`` (the same, through the SHA-256 ``HashingWriter``);
* ``verify``: ``integrity.verify_file`` (what every load now does before unpickling: size + SHA-256);
* ``load``: ``load_file`` (``torch.load(weights_only=True, mmap=True)``);
* ``dcp save`` / ``dcp load``: the tensors of the same payload through ``torch.distributed.checkpoint``
  (single process, ``FileSystemWriter``/``Reader``), for the format decision in ``docs/checkpoints.md``.

Prints medians in ms and MB/s, and a JSON line with everything. Files are in the page cache after
the first read, so ``verify`` measures hashing, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from lightrec.distributed.checkpoint import load_file
from lightrec.distributed.checkpoint.integrity import read_manifest, save_hashed, verify_file


def _plain_save(obj: Any, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _tensors(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested payload under a flat key (what DCP can store without pickling)."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.contiguous().clone()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="a sharded checkpoint folder (see the module docstring)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default=None, help="where to write the copies (default: a temp dir)")
    args = parser.parse_args(argv)

    manifest = read_manifest(args.checkpoint)
    work = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.workdir)
    times: dict[str, list[float]] = {
        k: [] for k in ("save plain", "save hashed", "verify", "load", "dcp save", "dcp load")
    }
    total = sum(r.bytes for name, r in manifest.files.items())
    payloads = {name: load_file(os.path.join(args.checkpoint, name)) for name in manifest.files}
    try:
        for rep in range(args.repeats):
            order = ["save plain", "save hashed"] if rep % 2 == 0 else ["save hashed", "save plain"]
            sample = dict.fromkeys(times, 0.0)
            for name, obj in payloads.items():
                target = os.path.join(work, name)
                for kind in order:
                    saver = _plain_save if kind == "save plain" else save_hashed
                    sample[kind] += _time(lambda: saver(obj, target))  # noqa: B023
                sample["verify"] += _time(lambda: verify_file(args.checkpoint, name, manifest.files[name]))  # noqa: B023
                sample["load"] += _time(lambda: load_file(os.path.join(args.checkpoint, name), mmap=True))  # noqa: B023
                flat = _tensors(obj)
                folder = os.path.join(work, f"dcp-{name}")
                shutil.rmtree(folder, ignore_errors=True)
                sample["dcp save"] += _time(lambda: dcp.save(flat, checkpoint_id=folder, no_dist=True))  # noqa: B023
                template = {k: torch.empty_like(v) for k, v in flat.items()}
                sample["dcp load"] += _time(lambda: dcp.load(template, checkpoint_id=folder, no_dist=True))  # noqa: B023
            for kind, ms in sample.items():
                times[kind].append(ms)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mb = total / 1e6
    result: dict[str, Any] = {"checkpoint": args.checkpoint, "bytes": total, "files": len(manifest.files)}
    print(f"checkpoint {args.checkpoint}: {len(manifest.files)} files, {mb:.1f} MB; median of {args.repeats}")
    for kind, values in times.items():
        ms = statistics.median(values)
        result[kind] = {"ms": ms, "MB_per_s": mb / (ms / 1e3)}
        print(f"  {kind:12s} {ms:9.1f} ms   {mb / (ms / 1e3):8.0f} MB/s")
    overhead = result["save hashed"]["ms"] - result["save plain"]["ms"]
    result["checksum_cost_on_save_ms"] = overhead
    print(f"  checksum cost on save: {overhead:+.1f} ms ({overhead / result['save plain']['ms']:+.1%}); "
          f"verify on load: {result['verify']['ms']:.1f} ms")  # fmt: skip
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
