"""``lightrec consolidate <folder> <file>``: a sharded checkpoint gathered into one file of full tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightrec.cli.common import CommandError, reject_extra_arguments
from lightrec.distributed.checkpoint import CheckpointError, consolidate_checkpoint

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "consolidate", help="gather a sharded checkpoint folder into one file of full tables", allow_abbrev=False
    )
    parser.add_argument("checkpoint", help="a sharded checkpoint folder (RecStrategy / ModelCheckpoint)")
    parser.add_argument("out", help="the file to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    source, out = Path(ns.checkpoint), Path(ns.out)
    if not source.exists():
        raise CommandError(f"checkpoint {str(source)!r} does not exist")
    if out.exists() and not ns.force:
        raise CommandError(f"{str(out)!r} exists; pass --force to replace it")
    try:
        consolidate_checkpoint(source, out)
    except CheckpointError as exc:
        raise CommandError(str(exc)) from exc
    print(f"consolidated {source} -> {out} ({out.stat().st_size / 2**20:.1f} MiB of full tables)")
    return 0
