"""Turn a sharded checkpoint directory into one file of full tables (no process group needed)."""

from __future__ import annotations

import os
from typing import Any

import torch

from lightrec.distributed.checkpoint.blocks import assemble
from lightrec.distributed.checkpoint.files import FORMAT
from lightrec.distributed.checkpoint.integrity import save_hashed
from lightrec.distributed.checkpoint.load import open_checkpoint

__all__ = ["consolidate_checkpoint"]


def consolidate_checkpoint(path: str | os.PathLike, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """Gather every table of the sharded checkpoint ``path`` into full tensors.

    Args:
        path: a sharded checkpoint directory (``RecStrategy`` / ``save_sharded_checkpoint``).
        out: where to write the result as one file (atomically: temp file + rename); None to
            only return it.

    Returns:
        A checkpoint dict whose ``state_dict`` has the keys and full tensors of the unsharded
        model -- ``LightningModule.load_from_checkpoint`` of the unsharded model, ``torch.load`` +
        ``load_state_dict`` and ``lightrec export`` read it directly. Optimizer and scheduler state
        (the saved blocks, unchanged) sit under ``"lightrec_consolidated"``, so ``RecStrategy`` /
        ``load_sharded_checkpoint`` resume training from this file on any number of ranks exactly as
        from the directory.

    The whole model is materialised in this process's memory: consolidate on a host that can hold it.
    """
    source = open_checkpoint(path)
    full_tables: dict[str, list[tuple[list[int], list[int], torch.Tensor]]] = {}
    state_dict = dict(source.meta.get("state_dict", {}))
    for key in sorted(source.saved_tables()):
        shape = source.table_shape(key)
        assert shape is not None  # saved_tables() lists keys with shapes
        full = assemble(source.table_blocks(key), [0, 0], shape, "elem", key)
        state_dict[key] = full
        full_tables[key] = [([0, 0], list(shape), full)]
    n_optim = max((len(p["optim"]) for p in source.payloads), default=0)
    # Optimizer state keeps the saved blocks: a row-wise accumulator of a column shard is per
    # block, and merging blocks would lose that (a resume on the saving plan must stay exact).
    optim = [
        {
            key: {name: {"kind": kind, "blocks": blocks} for name, (kind, blocks) in source.state_blocks(i, key).items()}
            for key in source.saved_tables()
        }
        for i in range(n_optim)
    ]
    first = source.payloads[0]
    payload = {
        "rank": 0,
        "shapes": {k: source.table_shape(k) for k in full_tables},
        "tables": full_tables,
        "optim": optim,
        # every rank's groups: a later load matches live groups to any of them
        "groups": [[g for p in source.payloads for g in p["groups"][i]] for i in range(n_optim)],
        "lr_schedulers": first["lr_schedulers"],
        "scheduler_optimizer": first["scheduler_optimizer"],
    }
    result = {k: v for k, v in source.meta.items() if k != "state_dict"}
    result["state_dict"] = state_dict
    result["lightrec_consolidated"] = {
        "format": FORMAT,
        "payload": payload,
        "dense_optim": source.dense_optim,
        "extra_optim": source.extra_optim,
        "has_training_state": source.has_training_state,
        "source_world_size": source.world_size,
    }
    if out is not None:
        out = os.fspath(out)
        tmp = f"{out}.tmp-{os.getpid()}"
        try:
            save_hashed(result, tmp, shown=out)  # synced; running out of space names `out` and the bytes
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return result
