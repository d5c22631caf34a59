"""Reading what another process sent: one strict JSON loader for every message that arrives
(the control channel, the wire's headers, a node's answers and requests), and a counter of what a
receiver dropped.

A message is refused (`Refused`, a ValueError) before it can cost more than a scan of its bytes:
larger than its kind allows, nested deeper than MAX_DEPTH (checked before json.loads recurses,
so no RecursionError), NaN or +-Infinity (JSON has neither; Python's json reads and writes them),
a float that overflows (1e400), an integer outside int64, or not JSON at all. `dumps` writes only
what `loads` takes back: a float that is not a number travels as null.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import accumulate
from typing import Any, Callable, Optional

from testbed.errors import MessageRefused

MAX_BYTES = 1 << 20  # a control message or a header: kilobytes
MAX_DEPTH = 64  # a RoleConfig (its scenario inside) nests about a dozen levels
INT_LIMIT = 1 << 63  # int64: counters, steps, seeds, sequence numbers all fit

_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # an escape pair, so that an escaped quote is no quote
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")
_DELTA = [0] * 256
_DELTA[ord("[")] = _DELTA[ord("{")] = 1
_DELTA[ord("]")] = _DELTA[ord("}")] = -1


class Refused(MessageRefused):
    """A message that is not one: `reason` says why in a few words (a drop counter's key)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _constant(name: str):
    raise Refused("not a number")  # NaN, Infinity, -Infinity


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused("number out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # before int() converts thousands of digits
        raise Refused("number out of range")
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise Refused("number out of range")
    return value


def nesting(data: bytes) -> int:
    """How deep the brackets outside strings nest: a linear scan, no recursion, no backtracking
    (escapes go first, then every other quote-separated part is outside a string)."""
    outside = b"".join(_ESCAPE.sub(b"", data).split(b'"')[::2])
    brackets = _NOT_BRACKET.sub(b"", outside)
    return max(accumulate(_DELTA[b] for b in brackets), default=0)


def loads(data: bytes | str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in `data`, or Refused."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise Refused("too large")
    if raw.count(b"[") + raw.count(b"{") > max_depth and nesting(raw) > max_depth:
        raise Refused("nested too deep")
    try:
        return json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except Refused:
        raise
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Refused("not JSON") from None


def finite(obj: Any) -> Any:
    """`obj` with every float that is not a number made None (what JSON can carry)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """JSON that `loads` takes back (a NaN loss is null, not NaN)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


class Drops(dict):
    """What a receiver dropped, by reason (a dict: reason -> count). The first drop of each reason
    is said once (`say`, stderr by default); the rest are only counted, for summary.json."""

    def __init__(self, who: str, say: Optional[Callable[[str], None]] = None):
        super().__init__()
        self.who = who
        self._say = say

    def add(self, reason: str, detail: str = "") -> None:
        first = reason not in self
        self[reason] = self.get(reason, 0) + 1
        if first:
            line = f"{self.who}: dropped a message ({reason}{': ' + detail[:160] if detail else ''}); " \
                   "more are only counted"
            (self._say or (lambda s: print(s, file=sys.stderr, flush=True)))(line)


def error_reason(e: BaseException) -> str:
    """A drop counter's reason for an exception a handler raised."""
    return e.reason if isinstance(e, Refused) else f"handler error ({type(e).__name__})"
