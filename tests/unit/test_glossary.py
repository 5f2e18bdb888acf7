"""One word, one meaning: the README's glossary is held by a test (CONVENTIONS, rules 11 and 13).

The glossary is read from the README at test time. For each of its words that
was once used for something else, :data:`RULES` says where a pattern means the
wrong thing (``where``, files or folders under ``gateway/``; empty: everywhere
but ``allowed``) and the word to use there instead. Every identifier, comment
and docstring under ``gateway/`` is read with :mod:`tokenize` (a plain string,
such as a CLI flag's spelling, a log line or a metric's help, is not a
docstring and is not read), and each banned use is reported as ``path:line:
found — the glossary's word is <word>``. A rule whose word leaves the glossary
fails too, so the table cannot outlive what it holds.

Public names keep their old word (README, "Glossary"): they are plain strings
here, or spelled in the rules' patterns as exceptions (``--replay``, the CLI
flag's alias).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "gateway"
README = REPO / "README.md"

# The README's outbox files: where the relay claims, delivers and records.
OUTBOX = (
    "gateway/postgres/outbox.py",
    "gateway/usecases/relay.py",
    "gateway/ops/events_command.py",
    "gateway/ops/event_metrics.py",
    "gateway/outbound/",
    "gateway/redis/event_stream.py",
    "gateway/domain/events.py",
)
# Where the relay claims its rows.
CLAIMS = ("gateway/postgres/outbox.py", "gateway/usecases/relay.py")
# Where "give back" would mean an order's return of its units.
RETURNS = (
    "gateway/usecases/lifecycle.py",
    "gateway/postgres/lifecycle.py",
    "gateway/postgres/orders.py",
    "gateway/redis/reservations.py",
    "gateway/redis/layout.py",
    "gateway/ops/audit.py",
    "gateway/ops/lifecycle_metrics.py",
    "gateway/http/payment_views.py",
)
# The waiting rooms' admission tokens, which a request id spends.
TOKENS = (
    "gateway/redis/rooms.py",
    "gateway/usecases/admission.py",
    "gateway/usecases/admission_tokens.py",
)
GIVE_BACK = r"\b_?(give|gives|given|giving|gave)[ _-]?back"
BOTH = frozenset({"name", "text"})


@dataclass(frozen=True)
class Rule:
    """A glossary ``word`` used for something else: ``pattern`` (case-insensitive)
    means the wrong thing under ``where`` (all of ``gateway/`` when empty) except
    ``allowed``; ``instead`` is the word to use there. ``kinds``: identifiers
    (``name``), comments and docstrings (``text``). ``instead_is_term``: the
    replacement is itself a glossary word, checked like ``word``."""

    word: str
    pattern: str
    instead: str
    where: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    kinds: frozenset[str] = BOTH
    instead_is_term: bool = True

    def applies(self, path: str, kind: str) -> bool:
        """Whether the rule reads a ``kind`` token of the file at ``path``."""
        inside = not self.where or any(path.startswith(w) for w in self.where)
        return kind in self.kinds and inside and not any(path.startswith(a) for a in self.allowed)


RULES: tuple[Rule, ...] = (
    # settle is the ledger's: an outbox claim records what a sink took.
    Rule("settle", r"\bsettl\w*", "record (a claim's outcome)", OUTBOX, instead_is_term=False),
    # replay is a purchase sent again: events made due again are a redelivery
    # (the CLI keeps --replay and --replay-since as aliases).
    Rule("replay", r"(?<!--)\breplay\w*", "redelivery", (*OUTBOX, "gateway/__main__.py")),
    # give back is a reservation's: a closed order's units are a return,
    Rule("give back", GIVE_BACK, "return", RETURNS),
    # a lock's hold ends with its release,
    Rule(
        "give back",
        GIVE_BACK,
        "release (of a hold)",
        ("gateway/lock/", "gateway/write/sku_locks.py"),
        instead_is_term=False,
    ),
    # and a spent admission token is unspent.
    Rule("give back", GIVE_BACK, "unspend (an admission token)", TOKENS, instead_is_term=False),
    # hold is a lock's (and held, units of unpaid orders): an outbox row is claimed,
    Rule("hold", r"\bhold\w*|\bheld\b", "claim", CLAIMS, instead_is_term=False),
    # a token's request id is its spender,
    Rule("hold", r"\bholders?\b", "spender (of an admission token)", TOKENS, instead_is_term=False),
    # and a batch waits (batch_wait).
    Rule(
        "hold",
        r"\bhold(s|ing)? (a |the )?batch(es)?\b|\bbatch(es)? (is |are )?(also )?held\b"
        r"|\bheld batch(es)?\b|\bbatch(es)? (is |are )?worth holding\b",
        "wait (a batch waits up to batch_wait)",
        instead_is_term=False,
    ),
    # An idle sku is the reconciler's: the write path's backlog or stream ran empty.
    Rule(
        "idle sku",
        r"\b_?idle\b|\b_?on_idle\b|\bIdleFn\b|\b_?idle_since\b",
        "empty (an idle sku is the reconciler's)",
        ("gateway/write/",),
        instead_is_term=False,
    ),
    Rule(
        "idle sku",
        r"^(_?on_|_)?idle(_since)?$|^IdleFn$",
        "empty (an idle sku is the reconciler's)",
        ("gateway/app.py", "gateway/flushing.py", "gateway/server.py"),
        kinds=frozenset({"name"}),
        instead_is_term=False,
    ),
    # queue is the queue strategy's alone: what waits for a flush is the backlog.
    Rule(
        "queue",
        r"\b(en)?queu\w*",
        "backlog",
        ("gateway/write/batcher.py", "gateway/write/lanes.py", "gateway/write/pace.py"),
    ),
    Rule("queue", r"\bqueued batch(es)?\b", "backlog"),
    Rule(
        "queue",
        r"enqueue",
        "backlog",
        allowed=(
            "gateway/redis/reservations.py",
            "gateway/redis/streams.py",
            "gateway/usecases/ports.py",
            "gateway/usecases/purchases.py",
        ),
    ),
    # A lock's contenders are no queue either.
    Rule("queue", r"\bqueue\w*", "contenders", ("gateway/lock/",), instead_is_term=False),
)


def glossary(text: str) -> list[tuple[str, list[str]]]:
    """The README glossary's bullets: (the bullet's text, its bold words), each
    bold ``a / b`` split into its words."""
    section = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n(?=- \*\*)", section)[1:]
    found: list[tuple[str, list[str]]] = []
    for bullet in bullets:
        bolds = re.findall(r"\*\*([^*]+)\*\*", bullet)
        found.append((bullet, [w.strip() for bold in bolds for w in bold.split("/")]))
    return found


def defined(text: str) -> set[str]:
    """Every word the glossary defines (in bold)."""
    return {w for _, words in glossary(text) for w in words}


def docstring_lines(tree: ast.AST) -> set[int]:
    """The first line of each module, class and function docstring."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.add(body[0].lineno)
    return lines


def words_of(source: str) -> Iterator[tuple[str, int, str]]:
    """(kind, line, text) of each identifier (``name``), comment and docstring
    (``text``) of a module."""
    docstrings = docstring_lines(ast.parse(source))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            yield "name", tok.start[0], tok.string
        elif tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and tok.start[0] in docstrings
        ):
            yield "text", tok.start[0], tok.string


def violations(root: Path = GATEWAY) -> list[str]:
    """Every banned use under ``root``, a ``gateway/`` package: ``path:line: found
    — the glossary's word is ...``."""
    found: list[str] = []
    compiled = [(rule, re.compile(rule.pattern, re.IGNORECASE)) for rule in RULES]
    for file in sorted(root.rglob("*.py")):
        path = f"gateway/{file.relative_to(root).as_posix()}"
        for kind, line, text in words_of(file.read_text()):
            for rule, pattern in compiled:
                if not rule.applies(path, kind):
                    continue
                for match in pattern.finditer(text):
                    at = line + text.count("\n", 0, match.start())
                    what = text if kind == "name" else match.group(0)
                    found.append(f"{path}:{at}: {what} — the glossary's word is {rule.instead}")
    return list(dict.fromkeys(found))


def test_no_banned_synonym_under_gateway() -> None:
    """No identifier, comment or docstring under gateway/ uses a glossary word
    for what the glossary calls by another word."""
    found = violations()
    assert not found, f"{len(found)} uses of a word the glossary reserves:\n" + "\n".join(found)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.word}->{r.instead.split()[0]}")
def test_each_rules_words_are_the_glossarys(rule: Rule) -> None:
    """A rule holds a word of the glossary (and names a glossary word instead,
    where it says so): a word that leaves the glossary fails here."""
    words = defined(README.read_text())
    assert rule.word in words, f"{rule.word!r} is no longer in the README's glossary"
    if rule.instead_is_term:
        assert rule.instead in words, f"{rule.instead!r} is not in the README's glossary"


def test_each_rule_reads_files_that_exist() -> None:
    """A rule's files and folders exist, so a move does not silently end it."""
    missing = [p for r in RULES for p in (*r.where, *r.allowed) if not (REPO / p).exists()]
    assert not missing, missing


def test_the_glossary_defines_each_word_once() -> None:
    """Each bold word is defined in one bullet alone; another bullet may name it
    in bold only to tell it apart, as someone's (``a lock's **hold**``, ``not a
    purchase's **replay**``)."""
    defs: dict[str, set[int]] = {}
    refs: dict[str, set[int]] = {}
    for i, (bullet, words) in enumerate(glossary(README.read_text())):
        for word in words:
            told_apart = re.search(rf"'s \*\*{re.escape(word)}\*\*", bullet)
            (refs if told_apart else defs).setdefault(word, set()).add(i)
    twice = sorted(w for w, bullets in defs.items() if len(bullets) > 1)
    assert not twice, f"defined in more than one bullet: {twice}"
    # A word only ever named as someone's is defined where it is, if only once.
    nowhere = sorted(w for w, bullets in refs.items() if w not in defs and len(bullets) > 1)
    assert not nowhere, f"told apart but never defined: {nowhere}"


def test_the_glossary_tells_the_reused_words_apart() -> None:
    """The words this test holds apart are each defined: a redelivery is not a
    replay, a return is not a give back, a hold is not held units."""
    words = defined(README.read_text())
    for word in ("redelivery", "replay", "return", "give back", "hold", "held", "backlog", "queue"):
        assert word in words, f"{word!r} is not defined in the README's glossary"


def test_the_scan_finds_a_planted_misuse(tmp_path: Path) -> None:
    """A misuse in an identifier, a comment or a docstring is reported with its
    file and line; a plain string (a public name, such as a flag) is not read."""
    planted = tmp_path / "gateway" / "usecases" / "lifecycle.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        '"""Closed orders:\n\ntheir units given back to Redis."""\n'
        "def _give_back() -> None:  # gives back the units\n"
        '    flag = "--give-back"\n'
    )
    word = "the glossary's word is return"
    assert violations(tmp_path / "gateway") == [
        f"gateway/usecases/lifecycle.py:3: given back — {word}",
        f"gateway/usecases/lifecycle.py:4: _give_back — {word}",
        f"gateway/usecases/lifecycle.py:4: gives back — {word}",
    ]
