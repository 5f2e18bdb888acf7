"""The layers import downward only: the tree is the architecture (README, "Layout").

Every import of a ``gateway`` module, the type-only ones included, is read from
the AST and checked against the layer it lands in. The top-level modules (the
entry point, the wiring, the process) may import any layer; ``gateway.settings``
is the configuration value every layer is handed, and imports only the domain.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "gateway"

# What each layer may import besides itself and gateway.settings, top to bottom:
# the README's "Which layer imports which", edge by edge (test_the_readme_says_so).
# lua, sql and the pages are package data, not code.
ALLOWED: dict[str, frozenset[str]] = {
    "http": frozenset({"usecases", "ops", "domain"}),
    "ops": frozenset({"domain"}),
    "usecases": frozenset({"strategies", "lock", "domain"}),
    "write": frozenset({"redis", "postgres", "lock", "domain"}),
    "strategies": frozenset({"postgres", "lock", "domain"}),
    "redis": frozenset({"lock", "domain"}),
    "postgres": frozenset({"domain"}),
    # The shop's own systems the events go to (webhook, RabbitMQ).
    "outbound": frozenset({"domain"}),
    "domain": frozenset(),
    # A library of its own: redis-py and asyncpg only.
    "lock": frozenset(),
}
# The modules that reach past their layer's rule, each named with its reason in
# the README.
EDGES: dict[str, frozenset[str]] = {
    "http/appkeys.py": frozenset({"postgres", "redis", "write", "lock"}),
    "http/middlewares.py": frozenset({"postgres", "lock"}),
    "ops/audit.py": frozenset({"redis", "postgres"}),
    "ops/events_command.py": frozenset({"postgres"}),
}
TOP_LEVEL = frozenset({"__init__", "__main__", "app", "flushing", "resources", "server"})


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every ``gateway`` module an AST imports; a name
    imported from a package (``from gateway.http import views``) counts as
    the module it names. A relative import is reported as ``.``: the gateway
    spells every import in full, so none escapes the check."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gateway")]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, "."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gateway"):
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return sorted(found)


def layer_of(dotted: str) -> str:
    """The layer a dotted name is in: ``gateway.<layer>...``, or ``settings``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(path: Path, root: Path = GATEWAY) -> list[str]:
    """The imports of the module at ``path`` (under the package ``root``) that its
    layer may not make."""
    relative = path.relative_to(root)
    layer = relative.parts[0] if len(relative.parts) > 1 else relative.stem
    if layer in TOP_LEVEL:
        return []
    if layer == "settings":
        allowed = {"domain"}
    else:
        allowed = {layer, "settings", *ALLOWED[layer], *EDGES.get(relative.as_posix(), ())}
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{relative}:{line} imports {name}"
        for line, name in imported(tree)
        if layer_of(name) not in allowed
    ]


def sources() -> list[Path]:
    return sorted(GATEWAY.rglob("*.py"))


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_no_layer_imports_upward(path: Path) -> None:
    """A module imports its own layer, the layers below it and the settings only."""
    assert upward(path) == []


def test_every_package_is_a_known_layer() -> None:
    """A new package under gateway/ takes its place in the rule above first."""
    packages = {p.parent.name for p in GATEWAY.glob("*/__init__.py")} - {"lua", "sql"}
    assert packages == set(ALLOWED)
    modules = {p.stem for p in GATEWAY.glob("*.py")}
    assert modules == TOP_LEVEL | {"settings"}, "the top level holds the entry and wiring"


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    """Every spelling of an upward import is caught, a type-only one included,
    and a downward one is not."""
    planted = tmp_path / "gateway" / "redis" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "from gateway.http import views\n"
        "import gateway.usecases.purchases\n"
        "if TYPE_CHECKING:\n    from gateway.write.batcher import Batcher\n"
        "from gateway.domain.model import Order\n"
        "from gateway.settings import Settings\n"
        "from . import layout\n"
    )
    assert upward(planted, tmp_path / "gateway") == [
        "redis/planted.py:1 imports gateway.http.views",
        "redis/planted.py:2 imports gateway.usecases.purchases",
        "redis/planted.py:4 imports gateway.write.batcher.Batcher",
        "redis/planted.py:7 imports .",
    ]


def _top_packages(folder: str) -> set[str]:
    """The top-level packages the Python files under ``folder`` import."""
    found: set[str] = set()
    for path in (REPO / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.partition(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return found


def test_the_suites_share_testkit_only() -> None:
    """tests/ and loadtests/ never import each other: what both need is testkit/,
    which imports neither (and the gateway imports none of the three)."""
    assert "loadtests" not in _top_packages("tests")
    assert "tests" not in _top_packages("loadtests")
    assert not {"tests", "loadtests"} & _top_packages("testkit")
    assert not {"tests", "loadtests", "testkit"} & _top_packages("gateway")


def _readme_map() -> dict[str, str]:
    """The README's layout map: each package's line by its name (``""``: the
    top level), from "## Layout" to what lies beside ``gateway/``."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Layout\n") : text.index("Beside `gateway/`:")]
    # A line of the map may wrap: its indented continuations join it.
    section = re.sub(r"\n {2,}", " ", section)
    lines: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("- `gateway/` itself"):
            lines[""] = line
        elif line.startswith("- `") and "/`" in line.split()[1]:
            lines[line.split("`")[1].rstrip("/")] = line
    return lines


def test_the_readme_maps_the_tree() -> None:
    """The README's layout has a line for each package of gateway/, naming every
    module in it, and none for a package that is not there."""
    lines = _readme_map()
    assert set(lines) == set(ALLOWED) | {""}
    for package, line in lines.items():
        folder = GATEWAY / package
        modules = {p.name for p in folder.glob("*.py")} - {"__init__.py"}
        missing = sorted(m for m in modules if f"`{m}`" not in line)
        assert not missing, f"README's line of {package or 'gateway'}/ lacks {missing}"


def _readme_rule() -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """The README's "Which layer imports which": each layer's imports, and each
    module's named beyond its layer's (every "`a` and `b` import `c`, `d` and
    `e`" in it, a module named by its path)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("Which layer imports which") : text.index("Every layer may read")]
    section = re.sub(r"\n {2,}", " ", section)
    names = r"`[\w/.]+`(?:(?:, | and )`[\w/.]+`)*"
    layers: dict[str, frozenset[str]] = {}
    edges: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        if not line.startswith("- `"):
            continue
        for subjects, objects in re.findall(rf"({names}) imports? (nothing|{names})", line):
            imported = frozenset(re.findall(r"`([\w/.]+)`", objects))
            for subject in re.findall(r"`([\w/.]+)`", subjects):
                (edges if "/" in subject else layers)[subject] = imported
    return layers, edges


def test_the_readme_says_so() -> None:
    """The rule above is the README's, word for word: every layer's imports and
    every module named beyond its layer."""
    layers, edges = _readme_rule()
    assert layers == ALLOWED
    assert edges == EDGES


def test_every_named_edge_is_used() -> None:
    """A module allowed past its layer's rule still needs it: an edge it no
    longer takes leaves the rule and the README."""
    for module, reach in EDGES.items():
        tree = ast.parse((GATEWAY / module).read_text())
        used = {layer_of(name) for _, name in imported(tree)}
        assert reach <= used, f"{module} no longer imports {sorted(reach - used)}"
