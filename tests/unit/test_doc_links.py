"""The docs' links lead somewhere: every relative link and image of the README
and of the pages under docs/ names a file that exists and, with a ``#fragment``,
a heading of that file (as GitHub makes its anchor), so moving a section to
another page cannot leave a link behind. Likewise every ``Class.attribute``
they name in a code span, where ``Class`` is a class of gateway/ (or of
testkit/, which the README names too), is one the class (or a class it derives
from) has, so renaming a method cannot either."""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
# A code span naming a class's attribute: `Purchases.purchase`, `Rows.decide()`.
ATTRIBUTE = re.compile(r"`([A-Z]\w*)\.(\w+)(?:\([^`]*\))?`")


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


class Found:
    """What the classes of gateway/ and testkit/ define, read from the AST: by
    class name (two classes of one name pool theirs), the attributes each defines (methods,
    class-level names, ``self.name`` assignments), the names of its bases, and
    the module of each, for bases that are not the gateway's."""

    def __init__(self) -> None:
        self.attributes: dict[str, set[str]] = defaultdict(set)
        self.bases: dict[str, set[str]] = defaultdict(set)
        self.modules: dict[str, set[str]] = defaultdict(set)
        for path in sorted([*(REPO / "gateway").rglob("*.py"), *(REPO / "testkit").rglob("*.py")]):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    self._read(node, module)

    def _read(self, node: ast.ClassDef, module: str) -> None:
        self.modules[node.name].add(module)
        self.bases[node.name] |= {ast.unparse(b).rpartition(".")[2] for b in node.bases}
        names = self.attributes[node.name]
        for item in ast.walk(node):
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(item.name)
            elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                names.add(item.id)
            elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                names.add(item.attr)

    def has(self, name: str, attribute: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether the gateway's class ``name`` has ``attribute``, itself, from a
        gateway base, or (for a base from elsewhere: an Enum, an Exception) at run time."""
        if attribute in self.attributes[name]:
            return True
        for base in self.bases[name] - seen:
            if base in self.attributes:
                if self.has(base, attribute, seen | {name}):
                    return True
            elif any(self._inherits(m, name, attribute) for m in self.modules[name]):
                return True
        return False

    @staticmethod
    def _inherits(module: str, name: str, attribute: str) -> bool:
        """Whether the class ``name`` of ``module`` has ``attribute`` in its MRO."""
        cls = getattr(importlib.import_module(module), name)
        return any(attribute in vars(k) for k in cls.__mro__)


def unknown_attributes(path: Path, found: Found) -> list[str]:
    """The ``Class.attribute`` code spans of ``path`` whose class is one of ours
    and lacks the attribute; names of no class of ours are left alone."""
    text = FENCE.sub("", path.read_text())
    return [
        f"{name}.{attribute}"
        for name, attribute in ATTRIBUTE.findall(text)
        if name in found.attributes and not found.has(name, attribute)
    ]


def test_every_class_attribute_named_exists() -> None:
    """No code span of the docs names an attribute its gateway class lacks."""
    found = Found()
    missing = {str(p.relative_to(REPO)): unknown_attributes(p, found) for p in DOCS}
    assert {name: bad for name, bad in missing.items() if bad} == {}


def test_the_attribute_check_sees_a_missing_method(tmp_path: Path) -> None:
    """A made-up method of a gateway class is caught; a real one, an instance
    attribute, an inherited one and a class that is not the gateway's are not."""
    page = tmp_path / "page.md"
    page.write_text(
        "`Purchases._deduct`, `Purchases.purchase`, `Deductions._in_flight`,"
        " `Strategy.value`, `Redis.evalsha`, `Batcher.full()`\n"
    )
    assert unknown_attributes(page, Found()) == ["Purchases._deduct"]
