"""A pickle of plain data (dicts, lists, tuples, numbers, strings, None and booleans) loaded
without trusting it, as FedScale ships its traces: its opcodes are scanned first, and a pickle
that holds anything else (a class, a function, a set), is truncated, or would take more than a
given memory once loaded is refused before a single object is built; the load itself then calls
no class or function at all.

The scan charges each opcode what it can cost once loaded, at most (CPython 3.11's sizes: an int
32 bytes, a dict 224 with its first 5 items and 60 more per item, a list 9 per item and 48 of
slack, a string 80 and 4 per byte, a memo slot 16, each value's stack slot 8), so that a pickle of
1-byte opcodes (EMPTY_DICT, 64 times its size in memory) or a 9-byte one naming memo slot 2^28
(4 GiB) is refused by its estimate.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any, Optional

from testbed.errors import MessageRefused

# An argument: a fixed number of bytes, a line, or a little-endian length of 1, 4 or 8 bytes and that many.
_LINE, _LEN1, _LEN4, _LEN8 = -1, -2, -3, -4
_LENGTHS = {_LEN1: 1, _LEN4: 4, _LEN8: 8}
# What an opcode does: push a value, nothing to the stack, or one of the kinds _stack_effect takes.
_PUSH, _NONE, _MARK, _POP, _APPEND, _SETITEM, _TUPLE1, _TUPLE2, _TUPLE3 = range(9)
_APPENDS, _SETITEMS, _LIST, _TUPLE, _DICT, _POP_MARK, _PUT, _MEMOIZE, _FRAME = range(9, 18)
# Bytes at most, once loaded (CPython 3.11): a value's slot on the unpickler's stack, in the memo
# table, in a list (with its slack) and in a dict; a mark; an int, a float, a string and each byte of it.
STACK_SLOT, MARK_SLOT, MEMO_SLOT, LIST_ITEM, LIST_SLACK, DICT_ITEM = 8, 16, 16, 9, 48, 60
INT, FLOAT, LIST, DICT, TUPLE, TUPLE_ITEM, STRING, STRING_BYTE = 32, 24, 56, 224, 40, 8, 80, 4
_TEXT = (_LINE, _PUSH, STRING, STRING_BYTE)

# opcode -> (argument, what it does, bytes it costs, bytes per byte of its argument)
_OPS: dict[bytes, tuple[int, int, int, int]] = {
    b"N": (0, _PUSH, 0, 0), b"\x88": (0, _PUSH, 0, 0), b"\x89": (0, _PUSH, 0, 0),  # None, True, False
    b"J": (4, _PUSH, INT, 0), b"K": (1, _PUSH, 0, 0), b"M": (2, _PUSH, INT, 0),  # BININT, BININT1 (cached), BININT2
    b"I": (_LINE, _PUSH, INT, 1), b"L": (_LINE, _PUSH, INT, 1),  # INT, LONG: digits
    b"\x8a": (_LEN1, _PUSH, INT, 1), b"\x8b": (_LEN4, _PUSH, INT, 1),  # LONG1, LONG4
    b"G": (8, _PUSH, FLOAT, 0), b"F": (_LINE, _PUSH, FLOAT, 0),  # BINFLOAT, FLOAT
    b"\x8c": (_LEN1, _PUSH, STRING, STRING_BYTE), b"X": (_LEN4, _PUSH, STRING, STRING_BYTE),  # str
    b"\x8d": (_LEN8, _PUSH, STRING, STRING_BYTE), b"V": _TEXT, b"S": _TEXT,
    b"U": (_LEN1, _PUSH, STRING, STRING_BYTE), b"T": (_LEN4, _PUSH, STRING, STRING_BYTE),  # Python 2's str
    b"C": (_LEN1, _PUSH, STRING, STRING_BYTE), b"B": (_LEN4, _PUSH, STRING, STRING_BYTE),  # bytes
    b"\x8e": (_LEN8, _PUSH, STRING, STRING_BYTE),
    b"]": (0, _PUSH, LIST, 0), b"}": (0, _PUSH, DICT, 0), b")": (0, _PUSH, 0, 0),  # empty list, dict, tuple
    b"h": (1, _PUSH, 0, 0), b"j": (4, _PUSH, 0, 0), b"g": (_LINE, _PUSH, 0, 0), b"2": (0, _PUSH, 0, 0),  # GETs, DUP
    b"(": (0, _MARK, MARK_SLOT, 0), b"0": (0, _POP, 0, 0), b"1": (0, _POP_MARK, 0, 0),
    b"a": (0, _APPEND, 0, 0), b"e": (0, _APPENDS, 0, 0), b"l": (0, _LIST, LIST, 0),
    b"s": (0, _SETITEM, 0, 0), b"u": (0, _SETITEMS, 0, 0), b"d": (0, _DICT, DICT, 0),
    b"\x85": (0, _TUPLE1, TUPLE + TUPLE_ITEM, 0), b"\x86": (0, _TUPLE2, TUPLE + 2 * TUPLE_ITEM, 0),
    b"\x87": (0, _TUPLE3, TUPLE + 3 * TUPLE_ITEM, 0), b"t": (0, _TUPLE, TUPLE, 0),
    b"q": (1, _PUT, 0, 0), b"r": (4, _PUT, 0, 0), b"p": (_LINE, _PUT, 0, 0), b"\x94": (0, _MEMOIZE, 0, 0),
    b"\x80": (1, _NONE, 0, 0), b"\x95": (8, _FRAME, 0, 0), b".": (0, _NONE, 0, 0),  # PROTO, FRAME, STOP
}
_TABLE: list[Optional[tuple[int, int, int, int]]] = [_OPS.get(bytes([i])) for i in range(256)]
_STOP = ord(".")
# BININT, BININT1, BININT2, BINFLOAT: (a run of that opcode and its argument, one's bytes, one's cost)
_RUNS: list[Optional[tuple[re.Pattern[bytes], int, int]]] = [None] * 256
for _code in b"JKMG":
    _size, _cost = 1 + _OPS[bytes([_code])][0], _OPS[bytes([_code])][2] + STACK_SLOT
    _RUNS[_code] = (re.compile(b"(?:%c[\\s\\S]{%d})+" % (_code, _size - 1)), _size, _cost)


class _NotPlain(MessageRefused):
    pass


class _PlainData(pickle.Unpickler):
    """An unpickler that loads no class or function (plain data needs none)."""

    def find_class(self, module: str, name: str):  # type: ignore[override]
        raise _NotPlain("holds objects other than plain dicts, lists and numbers (not loaded)")


def load_plain(raw: bytes, max_memory: int) -> Any:
    """The plain data pickled in `raw`, or ValueError saying why not in a few words."""
    if memory_needed(raw, max_memory) > max_memory:
        raise ValueError(f"would take more than {max_memory >> 20} MiB once loaded")
    try:
        return _PlainData(io.BytesIO(raw)).load()
    except _NotPlain:
        raise
    except Exception as e:  # a number that is not one, a memo slot never set: said without quoting it
        raise ValueError(f"not a pickle of plain data ({type(e).__name__})") from None


def memory_needed(raw: bytes, stop_past: int) -> int:
    """What loading `raw` can cost, at most, in bytes (the scan stops once past `stop_past`);
    ValueError for an opcode of anything but plain data, or for a truncated pickle."""
    at, depth, cost, memo_top = 0, 0, len(raw), 0  # the unpickler copies each frame it reads
    marks: list[int] = []
    while at < len(raw) and cost <= stop_past:
        code = raw[at]
        run = _RUNS[code]
        found = run[0].match(raw, at) if run is not None else None
        if run is not None and found is not None:  # numbers in a row, as a list of them pickles: one call
            n = (found.end() - at) // run[1]
            at, depth, cost = found.end(), depth + n, cost + n * run[2]
            continue
        op = _TABLE[code]
        if op is None:
            raise _NotPlain(f"holds objects other than plain dicts, lists and numbers (not loaded: byte {at})")
        shape, kind, fixed, per_byte = op
        arg, at = _argument(raw, at + 1, shape)
        cost += fixed + per_byte * len(arg)
        if kind == _PUSH:
            depth, cost = depth + 1, cost + STACK_SLOT
        elif kind == _PUT or kind == _MEMOIZE:
            index = memo_top + 1 if kind == _MEMOIZE else _index(arg, shape)
            cost += MEMO_SLOT * max(0, index - memo_top)
            memo_top = max(memo_top, index)
        elif kind == _FRAME:
            if int.from_bytes(arg, "little") > len(raw) - at:
                raise ValueError("truncated (a frame runs past its end)")
        elif kind == _MARK:
            marks.append(depth)
        elif kind != _NONE:
            depth, extra = _stack_effect(kind, depth, marks)
            cost += extra
        if code == _STOP:  # what follows is never loaded
            break
    return cost


def _argument(raw: bytes, at: int, shape: int) -> tuple[bytes, int]:
    """(the opcode's argument, where the next opcode starts)."""
    if shape >= 0:
        if at + shape > len(raw):
            raise ValueError("truncated")
        return raw[at:at + shape], at + shape
    if shape == _LINE:
        nl = raw.find(b"\n", at)
        if nl < 0:
            raise ValueError("truncated")
        return raw[at:nl], nl + 1
    width = _LENGTHS[shape]
    size = int.from_bytes(raw[at:at + width], "little")
    if at + width + size > len(raw):
        raise ValueError("truncated (a string runs past its end)")
    return raw[at + width:at + width + size], at + width + size


def _index(arg: bytes, shape: int) -> int:
    if shape != _LINE:
        return int.from_bytes(arg, "little")
    if not arg.isdigit() or len(arg) > 12:
        raise ValueError("not a pickle (a memo index that is not one)")
    return int(arg)


def _stack_effect(kind: int, depth: int, marks: list[int]) -> tuple[int, int]:
    """(the stack's depth after an opcode that takes values off it, the memory their container
    gains); ValueError for a pickle that takes more values than it made."""
    if kind == _POP and marks and marks[-1] == depth:  # POP takes the mark when nothing is above it
        marks.pop()
        return depth, 0
    taken, made, per_item, fixed = _TAKES[kind]
    if taken < 0:  # everything down to the last mark
        if not marks:
            raise ValueError("not a pickle (no mark)")
        taken = depth - marks.pop()
    elif depth - (marks[-1] if marks else 0) < taken:
        raise ValueError("not a pickle (takes more values than it made)")
    return depth - taken + made, fixed + per_item * taken


# kind -> (values taken, -1: down to the mark; values made; memory per value taken; memory per opcode)
_TAKES = {
    _POP: (1, 0, 0, 0), _APPEND: (1, 0, LIST_ITEM, LIST_SLACK), _SETITEM: (2, 0, DICT_ITEM // 2, 0),
    _TUPLE1: (1, 1, 0, 0), _TUPLE2: (2, 1, 0, 0), _TUPLE3: (3, 1, 0, 0),
    _APPENDS: (-1, 0, LIST_ITEM, LIST_SLACK), _LIST: (-1, 1, LIST_ITEM, LIST_SLACK),
    _SETITEMS: (-1, 0, DICT_ITEM // 2, 0), _DICT: (-1, 1, DICT_ITEM // 2, 0),
    _TUPLE: (-1, 1, TUPLE_ITEM, 0), _POP_MARK: (-1, 0, 0, 0),
}
