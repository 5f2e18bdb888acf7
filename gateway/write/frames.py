"""The frames a host's workers pass each other over their lanes (gateway.write.lanes).

A frame is one orjson line, a list:

- a purchase: ``[seq, purchase]``;
- its answer: ``[seq, result]`` (the result's ``order`` an order, or null);
- or its refusal: ``[seq, "<GatewayError class>", {argument: value}]``.

A dataclass (purchase, result, order) travels as the list of its fields'
values, in the order :func:`dataclasses.fields` gives on both sides: a field
moved in its class moves in the frame too, on the writer's side and the
reader's. A list of another length than its class's fields (a field added or
dropped on one side only) is refused with :class:`FrameMismatch`, never read
into other fields. Lists and not objects of names: a passed purchase and its
answer are each written once and read once, on the multi-worker hot path, and
a list is the cheaper of the two to write and to read (docs/performance.md,
"The lanes' frames").

An error travels by its class's name and its constructor's arguments by name
(each instance keeps every argument of its class's constructor as the
attribute of the same name); the reader rebuilds it with that constructor.
"""

from __future__ import annotations

import inspect
from dataclasses import fields
from operator import attrgetter
from typing import Any

import orjson

from gateway.domain.errors import GatewayError, Unavailable
from gateway.domain.model import Order, Outcome, Purchase, Result

Frame = list[Any]


class FrameMismatch(ValueError):
    """A frame's fields are not those of the class it names: the two workers
    disagree on its shape."""


def _names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_PURCHASE, _ORDER, _RESULT = (attrgetter(*_names(cls)) for cls in (Purchase, Order, Result))
# How many fields each dataclass a frame carries has.
_LENGTH: dict[type[Any], int] = {cls: len(_names(cls)) for cls in (Purchase, Order, Result)}
# Where a result's fields that are not plain values sit in its list.
_OUTCOME_AT, _ORDER_AT = _names(Result).index("outcome"), _names(Result).index("order")


def purchase_frame(seq: int, purchase: Purchase) -> bytes:
    """The frame passing ``purchase`` to its sku's owner."""
    return orjson.dumps([seq, _PURCHASE(purchase)]) + b"\n"


def result_frame(seq: int, result: Result) -> bytes:
    """The owner's answer to purchase ``seq``."""
    values = list(_RESULT(result))
    if result.order is not None:
        values[_ORDER_AT] = _ORDER(result.order)
    return orjson.dumps([seq, values]) + b"\n"


def error_frame(seq: int, error: GatewayError) -> bytes:
    """The owner's refusal of purchase ``seq``: the error's class and its
    constructor's arguments."""
    name = type(error).__name__
    args = {arg: getattr(error, arg) for arg in _ERRORS[name][1]}
    return orjson.dumps([seq, name, args]) + b"\n"


def read(line: bytes) -> Frame:
    """One frame from its line."""
    frame: Frame = orjson.loads(line)
    return frame


def is_result(frame: Frame) -> bool:
    """Whether an answer frame carries a result (else an error)."""
    return isinstance(frame[1], list)


def purchase_of(frame: Frame) -> Purchase:
    """The purchase a frame passes; raises :class:`FrameMismatch`."""
    return Purchase(*_checked(Purchase, frame[1]))


def result_of(frame: Frame) -> Result:
    """The result an answer frame carries; raises :class:`FrameMismatch`."""
    values = _checked(Result, frame[1])
    values[_OUTCOME_AT] = Outcome(values[_OUTCOME_AT])
    order = values[_ORDER_AT]
    if order is not None:
        values[_ORDER_AT] = Order(*_checked(Order, order))
    return Result(*values)


def error_of(frame: Frame) -> GatewayError:
    """The error a refusal frame names, built by its class's constructor (an
    unknown class reads as :class:`Unavailable`); raises :class:`FrameMismatch`."""
    cls, parameters = _ERRORS.get(frame[1], _ERRORS[Unavailable.__name__])
    args: dict[str, Any] = frame[2]
    if args.keys() != parameters:
        raise FrameMismatch(f"{cls.__name__} takes {sorted(parameters)}, the frame {sorted(args)}")
    return cls(**args)


def _checked(cls: type[Any], values: list[Any]) -> list[Any]:
    if len(values) != _LENGTH[cls]:
        raise FrameMismatch(f"{cls.__name__} has {_LENGTH[cls]} fields, the frame {len(values)}")
    return values


def _subclasses(cls: type[GatewayError]) -> list[type[GatewayError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


# Every gateway error by name, with its constructor's arguments.
_ERRORS: dict[str, tuple[type[GatewayError], frozenset[str]]] = {
    cls.__name__: (cls, frozenset(inspect.signature(cls).parameters))
    for cls in _subclasses(GatewayError)
}
