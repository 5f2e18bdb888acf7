"""docs/api.md and docs/openapi.yaml say the same (issue 40.8).

The route table of docs/api.md names, per route, the statuses it answers, the
codes of its error answers and the shape of its bodies; the schema says the
same in its own words. This reads both and fails where they part: a route in
one only, a status the schema does not answer, an error status whose codes
differ (the cancel's 404 pointed at ``unknown_sku``, its answer is
``not_found``), a code the schema has and the page never names
(``payment_id_taken``), a body shape missing a field the schema requires (the
201's ``pay_by``) or naming one it lacks, and an example request body (each
``curl -d``) the schema refuses.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson

from testkit.gateways import REPO
from testkit.schema import component, schema

API_MD = REPO / "docs" / "api.md"
METHODS = ("get", "post", "put", "patch", "delete")
# The statuses the gateway answers; another three-digit number in the prose
# (a default of 100, a body of 4096 bytes) is not one.
STATUSES = {200, 201, 202, 204, 304, 400, 401, 403, 404, 405, 408, 409, 413, 422, 428, 429, 503}
ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`?]*)")
STATUS = re.compile(r"(?<![\d.])([1-5]\d\d)(?![\d.])")
QUOTED_CODE = re.compile(r'"(?:error|status)":\s*"([a-z_]+)"')
WORD = re.compile(r"\b[a-z][a-z_]+\b")
# A flat body shape, as the table writes one: {"a","b":"value","c"?}.
SHAPE = re.compile(r'\{((?:"[a-z_]+"(?::"[^"]*")?\??,?)+)\}')
SHAPE_FIELD = re.compile(r'"([a-z_]+)"(?::"([^"]*)")?(\?)?')


def known_codes() -> set[str]:
    """Every code an answer may carry: the errors' and the refused outcomes'."""
    errors = component("Error")["properties"]["error"]["enum"]
    outcomes = component("NotConfirmed")["properties"]["status"]["enum"]
    return set(errors) | set(outcomes)


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (a component) followed."""
    while "$ref" in node:
        *_, kind, name = node["$ref"].split("/")
        node = schema()["components"][kind][name]
    return node


def operations() -> dict[tuple[str, str], dict[str, Any]]:
    """The schema's operations by (METHOD, path)."""
    return {
        (method.upper(), path): operation
        for path, item in schema()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }


def schema_codes(answer: dict[str, Any]) -> set[str]:
    """The codes a response of the schema names: in its description's
    backticks and in its examples."""
    answer = resolve(answer)
    known = known_codes()
    found = {
        w
        for span in re.findall(r"`([^`]*)`", answer.get("description", ""))
        for w in WORD.findall(span)
        if w in known
    }
    content = answer.get("content", {}).get("application/json", {})
    examples = [content.get("example")] + [
        e.get("value") for e in content.get("examples", {}).values()
    ]
    for example in examples:
        if isinstance(example, dict):
            found |= {str(example[k]) for k in ("error", "status") if k in example} & known
    return found


def rows() -> Iterator[tuple[list[tuple[str, str]], str]]:
    """The route table's rows: (the routes of the first cell, the answers cell)."""
    for line in API_MD.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        # A link's target (#after-the-201-...) names no status.
        cells = re.sub(r"\]\([^)]*\)", "]", line).strip("|").split(" | ")
        routes = [(m[1], m[2]) for m in ROUTE.finditer(cells[0])]
        if routes:
            yield routes, cells[1]


def spans(text: str) -> list[tuple[int, int]]:
    """Where ``text``'s backticked spans are."""
    return [(m.start(), m.end()) for m in re.finditer(r"`[^`]*`", text)]


def named(answers: str) -> tuple[set[int], dict[int, set[str]]]:
    """The statuses an answers cell names, and the codes it gives each error
    status: a code (in backticks) belongs to the status named last before it."""
    known = known_codes()
    code_spans = spans(answers)
    tokens: list[tuple[int, str]] = [(m.start(), m[1]) for m in STATUS.finditer(answers)]
    for start, end in code_spans:
        for m in QUOTED_CODE.finditer(answers, start, end):
            tokens.append((m.start(), "code:" + m[1]))
        for m in WORD.finditer(answers, start, end):
            if m[0] in known and answers[m.end() : m.end() + 2] != '":':
                tokens.append((m.start(), "code:" + m[0]))
    statuses: set[int] = set()
    codes: dict[int, set[str]] = defaultdict(set)
    current: int | None = None
    for _, token in sorted(tokens):
        if token.startswith("code:"):
            if current is not None and current >= 400:
                codes[current].add(token.removeprefix("code:"))
        elif int(token) in STATUSES:
            current = int(token)
            statuses.add(current)
    return statuses, codes


def test_the_table_and_the_schema_have_the_same_routes() -> None:
    """Every operation of the schema has its row in docs/api.md, and every row
    names operations of the schema."""
    in_table = {route for routes, _ in rows() for route in routes}
    assert in_table == set(operations())


def test_the_statuses_and_codes_of_each_route_agree() -> None:
    """Each status a row names is one the schema answers for its route, and
    each code a row gives an error status is one the schema names for it."""
    ops = operations()
    differ: list[tuple[list[tuple[str, str]], int, object]] = []
    for routes, answers in rows():
        statuses, codes = named(answers)
        responses = {int(s): r for route in routes for s, r in ops[route]["responses"].items()}
        differ += [(routes, s, "status not in the schema") for s in statuses - set(responses)]
        for status, listed in codes.items():
            if status in responses and not listed <= schema_codes(responses[status]):
                differ.append((routes, status, listed - schema_codes(responses[status])))
    assert differ == []


def test_every_code_of_the_schema_is_on_the_page() -> None:
    """A code the schema has (an error's, a refused purchase's) is named, in
    backticks, somewhere on docs/api.md."""
    text = API_MD.read_text()
    on_page = {w for start, end in spans(text) for w in WORD.findall(text[start:end])}
    assert sorted(known_codes() - on_page) == []


def branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    """An answer's schema as its alternatives (``oneOf``), each resolved."""
    node = resolve(node)
    if "oneOf" in node:
        return [b for branch in node["oneOf"] for b in branches(branch)]
    return [node]


def shape_problems(fields: dict[str, tuple[str | None, bool]], node: dict[str, Any]) -> list[str]:
    """What of a body shape (field -> (its value if given, optional)) the schema
    ``node`` refuses; empty when one of its alternatives takes it."""
    found = []
    for branch in branches(node):
        properties = branch.get("properties", {})
        problems = [f"no field {name}" for name in fields if name not in properties]
        given = {name for name, (_, optional) in fields.items() if not optional}
        problems += [f"{name} missing" for name in branch.get("required", []) if name not in given]
        for name, (value, _) in fields.items():
            rule = resolve(properties.get(name, {}))
            allowed = rule.get("enum", [rule["const"]] if "const" in rule else None)
            if value is not None and allowed is not None and value not in allowed:
                problems.append(f"{name}={value} not in {allowed}")
        if not problems:
            return []
        found.append("; ".join(problems))
    return found


def test_every_body_shape_in_the_table_fits_the_schema() -> None:
    """Each flat body a row shows (``201 {"status":"confirmed",...}``) names
    every field the schema requires of that answer, none it lacks, and
    values its enums hold."""
    ops = operations()
    refused = []
    for routes, answers in rows():
        for start, end in spans(answers):
            span = answers[start:end]
            shape = SHAPE.search(span)
            # A nested body ({"skus":[{...}]}) is the schema's to describe.
            if shape is None or len(routes) != 1 or "[" in span:
                continue
            # The status named last before the shape, in its cell: 200 when none.
            before = [
                s for s in STATUS.findall(answers[: start + shape.start()]) if int(s) in STATUSES
            ]
            status = before[-1] if before else "200"
            answer = resolve(ops[routes[0]]["responses"][status])
            node = answer.get("content", {}).get("application/json", {}).get("schema")
            assert node is not None, (routes, status)
            fields = {
                m[1]: (m[2] if m.lastindex and m[2] is not None else None, m[3] == "?")
                for m in SHAPE_FIELD.finditer(shape[1])
            }
            problems = shape_problems(fields, node)
            if problems:
                refused.append((routes[0], status, span, problems))
    assert refused == []


KINDS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def valid(value: Any, node: dict[str, Any]) -> list[str]:
    """What of ``value`` the JSON Schema ``node`` refuses, for the keywords the
    published schema uses on request bodies (no jsonschema in the lock file)."""
    node = resolve(node)
    options = node.get("oneOf", node.get("anyOf"))
    if options is not None:
        return [] if any(not valid(value, o) for o in options) else [f"{value!r}: no branch"]
    kinds = node.get("type", list(KINDS))
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if not any(KINDS[k](value) for k in kinds):
        return [f"{value!r} is not {kinds}"]
    if isinstance(value, dict):
        return _object_problems(value, node)
    return _value_problems(value, node)


def _value_problems(value: Any, node: dict[str, Any]) -> list[str]:
    """A scalar's enum, const, pattern and bounds."""
    problems = []
    if "enum" in node and value not in node["enum"]:
        problems.append(f"{value!r} not in {node['enum']}")
    if "const" in node and value != node["const"]:
        problems.append(f"{value!r} is not {node['const']!r}")
    if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
        problems.append(f"{value!r} does not match {node['pattern']}")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and not node.get("minimum", value) <= value <= node.get("maximum", value):
        problems.append(f"{value!r} out of bounds")
    return problems


def _object_problems(value: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """An object's required fields, its fields' values, and fields it may not have."""
    properties = node.get("properties", {})
    problems = [f"{name} missing" for name in node.get("required", []) if name not in value]
    for name, item in value.items():
        if name in properties:
            problems += valid(item, properties[name])
        elif node.get("additionalProperties") is False:
            problems.append(f"field {name} not in the schema")
    return problems


def path_of(url: str) -> tuple[str, str] | None:
    """The schema's path template a URL's path matches, with the path."""
    path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    for template in schema()["paths"]:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template.lstrip("/")))
        if re.fullmatch(pattern, path):
            return template, path
    return None


def examples() -> Iterator[tuple[int, str]]:
    """Each ``curl`` of the page's examples with the status its ``# expect``
    line gives it."""
    expected = 0
    for line in API_MD.read_text().splitlines():
        if line.startswith("# expect "):
            expected = int(line.split()[2].rstrip(":"))
        elif "curl " in line:
            yield expected, line[line.index("curl ") :].rstrip(")")


def test_every_example_request_body_fits_the_schema() -> None:
    """Each ``curl ... -d '<json>'`` of docs/api.md expected to succeed (2xx)
    sends a body the schema takes for its route (the gateway's answer to it
    is checked by tests/e2e/test_readme.py)."""
    checked, refused = 0, []
    for expected, command in examples():
        words = shlex.split(command)
        if "-d" not in words or not 200 <= expected < 300:
            continue
        method = words[words.index("-X") + 1] if "-X" in words else "POST"
        url = next(w for w in words if w.startswith("http"))
        found = path_of(url)
        assert found is not None, url
        body = orjson.loads(words[words.index("-d") + 1])
        node = schema()["paths"][found[0]][method.lower()]["requestBody"]
        problems = valid(body, node["content"]["application/json"]["schema"])
        checked += 1
        if problems:
            refused.append((method, url, body, problems))
    assert checked > 15, checked
    assert refused == []
