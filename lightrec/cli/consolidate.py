"""``lightrec consolidate <folder> <file>``: a sharded checkpoint gathered into one file of full tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightrec.cli.common import (
    CommandError,
    UsageError,
    checkpoint_argument,
    command_parser,
    output_argument,
    reject_extra_arguments,
)

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(sub, "consolidate", "gather a sharded checkpoint folder into one file of full tables")
    parser.add_argument("checkpoint", help="a sharded checkpoint folder (RecStrategy / ModelCheckpoint)")
    parser.add_argument("out", help="the file to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    from lightrec.distributed.checkpoint import (
        CheckpointError,
        ForeignCheckpointError,
        consolidate_checkpoint,
    )

    reject_extra_arguments(rest, parser)
    source, out = Path(ns.checkpoint), Path(ns.out)
    checkpoint_argument(source)
    output_argument(out, ns.force)
    try:
        consolidate_checkpoint(source, out)
    except ForeignCheckpointError as exc:  # a file, but not one lightrec wrote
        raise UsageError(str(exc)) from exc
    except CheckpointError as exc:  # damaged, or no room to write: names the file
        raise CommandError(str(exc)) from exc
    except OSError as exc:  # e.g. no permission to write there
        raise CommandError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    print(f"consolidated {source} -> {out} ({out.stat().st_size / 2**20:.1f} MiB of full tables)")
    return 0
