"""Every answer the gateway can give is in the published schema (docs/openapi.yaml).

The error classes of ``gateway.domain.errors`` are walked, not listed: a new class
whose code or status the schema lacks fails here before a schema fuzzer finds
it (issue 20: ``idempotency_mismatch`` answered, and missing from the schema).
The schema's links, which the fuzzer's stateful phase follows, read fields the
answers declare.
"""

from __future__ import annotations

from typing import Any

from gateway.domain.errors import GatewayError, MethodNotAllowed
from gateway.http import limits
from testkit.schema import component, responses, schema

PURCHASE = ("/v1/purchase", "post")


def error_classes() -> list[type[GatewayError]]:
    """GatewayError and every subclass, however deep."""
    found: list[type[GatewayError]] = []
    todo = [GatewayError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def answers_with_status(cls: type[GatewayError]) -> bool:
    """Whether the class answers ``{"status": code}`` (an outcome such as
    ``not_started``) rather than ``{"error": code}``."""
    return any("body" in vars(k) for k in cls.__mro__ if k is not GatewayError)


def test_every_error_code_is_in_the_schema() -> None:
    """Each class's code is in the Error enum, or, for an outcome answered with
    ``status``, in NotConfirmed's."""
    errors = set(component("Error")["properties"]["error"]["enum"])
    statuses = set(component("NotConfirmed")["properties"]["status"]["enum"])
    classes = error_classes()
    assert len(classes) > 20, "the walk found too few classes"
    missing = [
        (cls.__name__, cls.code)
        for cls in classes
        if cls.code not in (statuses if answers_with_status(cls) else errors)
    ]
    assert missing == []


def test_the_guards_own_codes_are_in_the_schema() -> None:
    """The codes the connection guard answers with before any handler runs."""
    errors = set(component("Error")["properties"]["error"]["enum"])
    assert set(limits._CODES.values()) <= errors


def test_every_error_status_is_answered_somewhere() -> None:
    """Each class's HTTP status is a documented response of some operation (405
    belongs to no operation: the schema's description covers it)."""
    documented = {
        int(status)
        for operations in schema()["paths"].values()
        for operation in operations.values()
        for status in operation["responses"]
    }
    statuses = {cls.status for cls in error_classes() if cls is not MethodNotAllowed}
    assert statuses <= documented
    assert "wrong methods 405 `method_not_allowed`" in schema()["info"]["description"]


def test_retry_after_is_documented_where_it_is_sent() -> None:
    """A purchase's 409 (in_progress, not_started), 429 and 503 carry Retry-After,
    and the schema says so."""
    answers = responses(*PURCHASE)
    for status in ("409", "429", "503"):
        assert "Retry-After" in answers[status].get("headers", {}), status


def _properties(answer_schema: dict[str, Any]) -> set[str]:
    """The fields an answer's schema declares, over its oneOf branches, ``$ref``s resolved."""
    if "$ref" in answer_schema:
        answer_schema = component(answer_schema["$ref"].rsplit("/", 1)[1])
    found = set(answer_schema.get("properties", {}))
    for branch in answer_schema.get("oneOf", []):
        found |= _properties(branch)
    return found


def test_every_link_reads_fields_the_answer_declares() -> None:
    """Each ``$response.body#/<field>`` of a link names a field of the answer it
    follows: a misspelt or missing one is silently skipped by a client following
    the link (schemathesis's stateful phase then never makes the call it means)."""
    undeclared = []
    for path, operations in schema()["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                declared = _properties(
                    answer.get("content", {}).get("application/json", {}).get("schema", {})
                )
                for name, link in answer.get("links", {}).items():
                    values = [
                        *link.get("parameters", {}).values(),
                        *link.get("requestBody", {}).values(),
                    ]
                    for value in values:
                        field = value.removeprefix("$response.body#/")
                        if field != value and field not in declared:
                            undeclared.append((path, method, status, name, field))
    assert undeclared == []


def test_the_link_from_an_admitted_poll_names_the_whole_purchase() -> None:
    """BuyAdmitted gives the purchase its token and the sku and user the token was
    signed for (issue 20: without the user every purchase it led to was 403, so
    the stateful phase never bought through a waiting room)."""
    answer = schema()["paths"]["/v1/queue/{sku}/{ticket}"]["get"]["responses"]["200"]
    link = answer["links"]["BuyAdmitted"]
    assert link["parameters"] == {"header.Admission-Token": "$response.body#/admission_token"}
    assert link["requestBody"] == {"sku": "$request.path.sku", "user_id": "$response.body#/user_id"}


def test_every_link_to_the_order_lookup_names_the_buyer() -> None:
    """A link to getOrder passes the purchase's ``user_id`` as well as its request
    id (issue 33: the lookup answers its buyer alone, so a link without one leads
    only to the unknown id's 404)."""
    links = [
        (path, status, link["parameters"])
        for path, operations in schema()["paths"].items()
        for operation in operations.values()
        for status, answer in operation["responses"].items()
        for link in answer.get("links", {}).values()
        if link.get("operationId") == "getOrder"
    ]
    assert len(links) == 2
    for path, status, parameters in links:
        assert set(parameters) == {"request_id", "user_id"}, (path, status)
