"""The verdict letters are one vocabulary: ``gateway.domain.model.Verdict``,
``sql/functions/flush_batch.sql`` and ``lua/settle.lua`` agree on them.

The letters are plain literals on both sides of Python, so nothing else ties
them together: a verdict added to the enum, or produced by the SQL, or handled
by the Lua script, on one side only, fails here. The files are read as text,
with comments removed first (their prose quotes letters freely), and the
letters are taken from the only places a verdict can appear:

* SQL: a verdict is a one-letter string literal (``'S'::text``, ``THEN 'C'``).
  No other one-letter literal occurs in the function's code.
* Lua: the script compares ``verdict`` with a letter (``verdict == "C"``,
  ``verdict ~= "D"``); whatever it names in no comparison takes the release
  branch. Its header contract lists every letter it accepts (``verdict "R"
  released: ...``). settle.lua knows no ``X``: Python settles an expired
  reservation as released (``Verdict.settled_as``).
"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.domain.model import Verdict

ROOT = Path(__file__).resolve().parents[2]
FLUSH_BATCH = ROOT / "sql" / "functions" / "flush_batch.sql"
SETTLE = ROOT / "lua" / "settle.lua"

SQL_COMMENT = re.compile(r"--[^\n]*")
SQL_LETTER = re.compile(r"'([A-Za-z])'")
LUA_COMMENT = SQL_COMMENT  # Lua's line comments start with "--" too
LUA_COMPARED = re.compile(r"\bverdict\s*[~=]=\s*\"([A-Za-z])\"")
LUA_CONTRACT = re.compile(r"^--\s+verdict \"([A-Za-z])\"", re.M)


def sql_letters(text: str) -> set[str]:
    """The verdict letters ``flush_batch()`` can return: its one-letter literals."""
    return set(SQL_LETTER.findall(SQL_COMMENT.sub("", text)))


def lua_compared(text: str) -> set[str]:
    """The letters settle.lua's code tests ``verdict`` against."""
    return set(LUA_COMPARED.findall(LUA_COMMENT.sub("", text)))


def lua_contract(text: str) -> set[str]:
    """The letters settle.lua's header says it accepts (``--   verdict "C" ...``)."""
    return set(LUA_CONTRACT.findall(text))


def settled_letters() -> set[str]:
    """The letters Python hands settle.lua: every verdict as it is settled."""
    return {v.settled_as.value for v in Verdict}


class TestVerdictLetters:
    """PostgreSQL, Python and Redis share one set of verdict letters."""

    def test_flush_batch_produces_exactly_the_enums_letters(self) -> None:
        """The one-letter literals in flush_batch()'s code are Verdict's values."""
        assert sql_letters(FLUSH_BATCH.read_text()) == {v.value for v in Verdict}

    def test_settle_lua_handles_exactly_the_letters_it_is_given(self) -> None:
        """settle.lua's contract lists the letters Python settles with; its code
        names each of them but one, and that one is the release branch's."""
        text = SETTLE.read_text()
        contract, compared = lua_contract(text), lua_compared(text)
        assert contract == settled_letters()
        assert compared <= contract, "the script tests a letter no verdict has"
        assert contract - compared == {Verdict.RELEASED.value}, (
            "every letter but R needs its own branch; R takes the fall-through"
        )

    def test_the_parsers_see_a_planted_letter(self) -> None:
        """A new letter in either file, outside a comment, is seen; one in a comment
        is not. Shows the checks above can fail."""
        sql = "-- 'Q' only in prose\nd_verdicts := d_verdicts || 'N'::text;\n"
        assert sql_letters(sql) == {"N"}
        lua = (
            '--   verdict "N" new: described\n'
            '-- if verdict == "Q" then (prose)\n'
            'if verdict == "N" then\nend\n'
        )
        assert (lua_contract(lua), lua_compared(lua)) == ({"N"}, {"N"})
