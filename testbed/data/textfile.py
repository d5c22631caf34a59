"""Reading a user's file (a trace) without trusting it: a size cap before and after gzip, strict
UTF-8, JSON of bounded depth and size, and errors that name the file and never quote it (a trace
path may point anywhere)."""

from __future__ import annotations

import json
import math
import re
import zlib
from itertools import accumulate
from pathlib import Path
from typing import Any

MAX_TRACE_BYTES = 16 << 20  # a week of Mahimahi deliveries at 100 Mbit/s is about 4 MB
GZIP_CHUNK = 1 << 12  # input per call after the first member: each member's end copies at most this much
_ZEROS = re.compile(rb"\0*")  # padding between gzip members, as gzip.decompress skips it
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # an escape pair, so that an escaped quote is no quote
_STRING = re.compile(rb'"[^"]*"')  # a string once its escapes are gone
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")
_DEPTH = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def read_capped_text(path: str | Path, limit: int = MAX_TRACE_BYTES) -> str:
    """The file's text, or ValueError with one line, `PATH: why`."""
    try:
        return capped_text(path, limit)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def capped_bytes(path: str | Path, limit: int) -> bytes:
    """The file's bytes, or ValueError saying why not (without the path)."""
    p = Path(path)
    if not p.is_file():  # a device (/dev/zero), a FIFO or a folder would never end or mislead
        raise ValueError("not a regular file" if p.exists() else "no such file")
    try:
        with open(p, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise ValueError(f"larger than {limit / 2**20:g} MiB")
    return raw


def capped_text(path: str | Path, limit: int) -> str:
    """The file's text, or ValueError saying why not (without the path)."""
    raw = capped_bytes(path, limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start})") from None


def gunzip_capped(raw: bytes, limit: int) -> bytes:
    """gzip data decompressed, every member, or ValueError: not gzip, truncated, or more than
    `limit` bytes (decompression stops there)."""
    first = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = first.decompress(raw, limit + 1)  # one member, the usual file: no copy of the output
    except zlib.error:
        raise ValueError("not gzip data") from None
    if len(out) > limit:
        raise ValueError(f"larger than {limit / 2**20:g} MiB uncompressed")
    if not first.eof:
        raise ValueError("truncated gzip data")
    at = _ZEROS.match(raw, len(raw) - len(first.unused_data)).end()  # type: ignore[union-attr]
    if at == len(raw):
        return out
    pieces = _members(raw, at, limit - len(out))
    if pieces is None:
        raise ValueError(f"larger than {limit / 2**20:g} MiB uncompressed")
    return b"".join([out, *pieces])


def _members(raw: bytes, at: int, room: int) -> list[bytes] | None:
    """The gzip members from `at` on, fed in small chunks (a member's end copies the rest of its
    chunk only, so many tiny members cost time in proportion to their bytes); None past `room`."""
    view, pieces, total = memoryview(raw), [], 0
    while at < len(raw):
        member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        while not member.eof:
            if at >= len(raw):
                raise ValueError("truncated gzip data")
            chunk = view[at:at + GZIP_CHUNK]
            try:
                piece = member.decompress(chunk, room + 1 - total)
            except zlib.error:
                raise ValueError("not gzip data after its first member") from None
            total += len(piece)
            if total > room:
                return None
            if piece:
                pieces.append(piece)
            at += len(chunk) - len(member.unused_data)
        at = _ZEROS.match(raw, at).end()  # type: ignore[union-attr]
    return pieces


def bounded_json(raw: bytes, max_depth: int, max_items: int) -> Any:
    """The JSON value in `raw`, or ValueError saying why not: more than `max_items` values, keys
    included (counted by their brackets, commas and colons before parsing, so that memory stays in
    proportion to them), nested deeper than `max_depth` (checked before json.loads recurses), a
    number past a float's range, NaN or Infinity, or not JSON at all."""
    outside = _STRING.sub(b"", _ESCAPE.sub(b"", raw))  # escapes first: then no quote is escaped
    containers = outside.count(b"[") + outside.count(b"{")
    if containers + outside.count(b",") + outside.count(b":") > max_items:
        raise ValueError(f"more than {max_items} JSON values")
    if containers > max_depth:
        brackets = _NOT_BRACKET.sub(b"", outside)
        if max(accumulate(_DEPTH[b] for b in brackets), default=0) > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(raw, parse_constant=_no_number, parse_float=_finite)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON (line {e.lineno})") from None
    except (ValueError, RecursionError):  # a 5,000-digit integer, bytes that are not UTF-8
        raise ValueError("not JSON") from None


def _no_number(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: JSON has neither


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text[:20])  # 1e400
    return value
