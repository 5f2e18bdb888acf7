"""No positional booleans under ``gateway/``: a boolean that selects behaviour
is named where it is passed (a keyword-only parameter), or is an enum.

Read from the AST, so it costs a parse of each module and nothing else:

* a parameter that defaults to ``True``/``False``, or is annotated ``bool``,
  is keyword-only (after ``*``);
* no call passes a bare ``True``/``False`` positionally (``f(x, True)``), but
  to the callees in :data:`VALUE_CALLEES`, where the boolean is a value (a
  mapping's default, a setting's default), not a switch.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"

# Callees whose bare boolean argument is data, not a switch: dict.get's default
# (a JSON field's when absent) and a Settings field's default.
VALUE_CALLEES = frozenset({"get", "setting"})
# Callbacks whose signature their caller fixes: the ZooKeeper session's watch
# passes what happened (``gone``) to the lock's callback.
CALLBACKS = frozenset({("gateway/lock/zookeeper.py", "on_event")})


def _is_bool(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, bool)


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _passes_a_flag(call: ast.Call) -> bool:
    """Whether ``call`` passes a bare boolean by position to a callee that takes it as a switch."""
    return _callee(call) not in VALUE_CALLEES and any(_is_bool(arg) for arg in call.args)


def _flags(source: str, name: str) -> list[str]:
    """Where the module ``name`` (its ``source``) takes or passes a boolean positionally."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if (name, node.name) in CALLBACKS:
                continue
            positional = [*node.args.posonlyargs, *node.args.args]
            defaults: list[ast.expr | None] = [None] * (len(positional) - len(node.args.defaults))
            for arg, default in zip(positional, [*defaults, *node.args.defaults], strict=True):
                annotated = arg.annotation is not None and ast.unparse(arg.annotation) == "bool"
                if annotated or _is_bool(default):
                    found.append(f"{name}:{node.lineno}: {node.name}({arg.arg}) is positional")
        elif isinstance(node, ast.Call) and _passes_a_flag(node):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node.func)}(..., bool)")
    return found


def test_no_boolean_is_taken_or_passed_positionally() -> None:
    """Every boolean parameter under gateway/ is keyword-only, and no call there
    passes a bare True or False by position."""
    found = [
        flag
        for path in sorted(GATEWAY.rglob("*.py"))
        for flag in _flags(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not found, "positional booleans (make them keyword-only, or an enum):\n" + "\n".join(
        found
    )


def test_the_scan_sees_a_positional_flag() -> None:
    """The scan finds what it forbids (a rule that reads nothing passes), and
    lets a keyword-only flag, a keyword argument and a value callee be."""
    source = (
        "def f(x, quick=False): ...\n"
        "def g(x, *, quick: bool = False): ...\n"
        "def h(x, y: bool): ...\n"
        "f(1, True)\n"
        "g(1, quick=True)\n"
        "{}.get('a', False)\n"
    )
    assert _flags(source, "probe.py") == [
        "probe.py:1: f(quick) is positional",
        "probe.py:3: h(y) is positional",
        "probe.py:4: f(..., bool)",
    ]
