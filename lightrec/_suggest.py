"""``(did you mean 'x'?)`` for a mistyped name: one rule for the ``lightrec`` command and the recipes' checks.

Imports nothing heavy, so a usage error of ``lightrec`` names the nearest recipe without loading Lightning.
"""

from __future__ import annotations

import difflib

__all__ = ["nearest"]


def nearest(word: str, choices: list[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` to ``word`` (empty when none is close)."""
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
