"""What one request may hold, and how a refused request is said: `RestError` (an HTTP status
and the message TensorFlow Serving would answer with), `Limits` (the per-request limits, each
a flag of ``tfx-serve``), `check_json` (depth and size of a body, before it is parsed) and
`prefer_wait` (a client's own deadline). Nothing here needs TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Limits", "RestError", "check_json", "prefer_wait"]


class RestError(Exception):
    """A request the server refuses: ``status`` (HTTP code) and ``message`` (the body's error)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one request may hold (None: no limit); each is a flag of ``tfx-serve``.

    Attributes:
        max_string_bytes: the longest text (a JSON string, not ``{"b64": ...}``) of an
            instance, in UTF-8 bytes (``--max-string-bytes``).
        max_json_depth: the deepest nesting of JSON arrays and objects (``--max-json-depth``).
        max_json_values: the most JSON values (numbers, strings, arrays...) in the body
            (``--max-json-values``).
        max_image_pixels: the most pixels (width x height, read from the header) of an
            encoded image sent as ``{"b64": ...}`` (``--max-image-pixels``).
    """

    max_string_bytes: int | None = None
    max_json_depth: int | None = None
    max_json_values: int | None = None
    max_image_pixels: int | None = None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check_json(body: bytes, max_depth: int | None, max_values: int | None) -> None:
    """Refuses a body nested deeper than ``max_depth`` or holding more than ``max_values``
    JSON values, before it is parsed (Python's parser recurses once per level and builds an
    object per value). Counted on the bytes, strings left out: values are at most the commas
    plus the arrays and objects plus one.

    Raises:
        RestError: 400 naming the depth or the count, the limit and its flag.
    """
    if max_depth is None and max_values is None:
        return
    skeleton = _STRING.sub(b'""', body)
    brackets = skeleton.translate(None, _NOT_BRACKETS)
    opened = brackets.count(b"[") + brackets.count(b"{")
    if max_depth is not None and opened > max_depth:
        depth = deepest = 0
        for start in range(0, len(brackets), 1 << 20):  # 4 MiB of int32 steps at a time
            steps = np.frombuffer(brackets, np.uint8, min(1 << 20, len(brackets) - start), start)
            levels = np.cumsum(np.where(steps % 4 == 3, 1, -1), dtype=np.int32) + depth
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        if deepest > max_depth:  # "[" is 0x5B and "{" 0x7B: 3 modulo 4; "]", "}": 1
            raise RestError(f"the request's JSON is nested {deepest:,} levels deep, deeper "
                            f"than the server's limit of {max_depth} (--max-json-depth)")
    values = skeleton.count(b",") + opened + 1
    if max_values is not None and values > max_values:
        raise RestError(f"the request's JSON holds about {values:,} values, more than the "
                        f"server's limit of {max_values:,} (--max-json-values)")


_WAIT = re.compile(r'^wait\s*=\s*"?(\d{1,9})"?$', re.IGNORECASE)


def prefer_wait(headers: list[str]) -> int | None:
    """The ``wait`` preference of a request's ``Prefer`` headers (RFC 7240, section 4.3: the
    seconds the client expects processing to take at most; the server may then "cancel
    processing"), or None. Preferences are comma-separated and may carry ``;`` parameters;
    one that is malformed or unknown is ignored, as the RFC asks; of several waits, the first.
    """
    for header in headers:
        for preference in header.split(","):
            match = _WAIT.match(preference.split(";")[0].strip())
            if match:
                return int(match[1])
    return None
