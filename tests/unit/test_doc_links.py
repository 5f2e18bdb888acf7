"""The docs' links lead somewhere: every relative link and image of the README
and of the pages under docs/ names a file that exists and, with a ``#fragment``,
a heading of that file (as GitHub makes its anchor), so moving a section to
another page cannot leave a link behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def prose(path: Path) -> str:
    """The file's text without code blocks and code spans."""
    return CODE.sub("", FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the file's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    found: set[str] = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text())):
        text = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower())
        found.add(text.replace(" ", "-"))
    return found


def broken(path: Path) -> list[str]:
    """The relative links of ``path`` that lead nowhere."""
    bad: list[str] = []
    for target in LINK.findall(prose(path)):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, fragment = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            bad.append(target)
            continue
        if fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            bad.append(target)
    return bad


def test_every_relative_link_resolves() -> None:
    """No link of the docs names a missing file or a heading its file lacks."""
    found = {str(p.relative_to(REPO)): broken(p) for p in DOCS}
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_the_readme_links_every_page() -> None:
    """Each page of docs/ is reached from the README, directly."""
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(prose(DOCS[0]))}
    pages = {p.resolve() for p in DOCS[1:]}
    assert sorted(str(p.relative_to(REPO)) for p in pages - linked) == []
