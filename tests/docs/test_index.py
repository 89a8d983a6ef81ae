"""docs/index.md links every page, and the links of the tutorial and guides lead somewhere.

Relative links must name an existing file; a ``#fragment`` must be the anchor of a heading of the
target page, computed as GitHub does (lower case, punctuation dropped, spaces to hyphens).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _without_code(text: str) -> str:
    """The page without fenced blocks (a ``# comment`` in a bash block is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def github_anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # drops backticks, dots, colons, commas, parentheses
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found = set()
    for line in _without_code(page.read_text()).splitlines():
        match = _HEADING.match(line)
        if match:
            found.add(github_anchor(match.group(1)))
    return found


def links(page: Path) -> list[str]:
    return _LINK.findall(_without_code(page.read_text()))


def test_index_links_every_page() -> None:
    linked = {(DOCS / target.split("#")[0]).resolve() for target in links(DOCS / "index.md")}
    pages = {p.resolve() for p in DOCS.rglob("*.md") if p.name != "index.md"}
    missing = sorted(str(p.relative_to(DOCS)) for p in pages - linked)
    assert not missing, f"docs/index.md does not link {missing}"


@pytest.mark.parametrize(
    "page",
    ["index.md", "tutorial.md", *(f"howto/{p.name}" for p in sorted((DOCS / "howto").glob("*.md")))],
)
def test_relative_links_resolve(page: str) -> None:
    source = DOCS / page
    broken = []
    for target in links(source):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, fragment = target.partition("#")
        destination = (source.parent / path).resolve() if path else source
        if not destination.exists():
            broken.append(f"{target} (no file {destination})")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target} (no heading with anchor #{fragment} in {destination.name})")
    assert not broken, f"docs/{page} has broken links: {broken}"


def test_readme_links_the_documentation_index() -> None:
    assert "docs/index.md" in (ROOT / "README.md").read_text(), (
        "README.md should point readers to docs/index.md (the docs' table of contents)"
    )


def test_github_anchor_rules() -> None:
    assert github_anchor("3. Sharding: planner, sharder, `DistributedModelParallel`") == (
        "3-sharding-planner-sharder-distributedmodelparallel"
    )
    assert github_anchor("Criteo Kaggle and 1TB") == "criteo-kaggle-and-1tb"
