"""Field checks of the frozen configuration dataclasses (`NMTConfig`, `DecodingSettings`).

Each check raises ``ValueError`` naming the dataclass, the field and the received value, e.g.
"`NMTConfig.d_model` must be an integer >= 1. Received: d_model=0".
"""

from __future__ import annotations

import math
import numbers

__all__ = ["check_bool", "check_int", "check_number"]


def check_int(owner: str, name: str, value, minimum: int) -> None:
    """Raises unless ``value`` is an ``int`` (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"`{owner}.{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )


def check_number(owner: str, name: str, value, minimum: float, maximum: float | None = None,
                 *, exclusive_minimum: bool = False) -> None:
    """Raises unless ``value`` is a finite real number in the range.

    The range is ``[minimum, maximum)`` (``(minimum, maximum)`` with ``exclusive_minimum``), or
    unbounded above when ``maximum`` is None.
    """
    low = f"({minimum}" if exclusive_minimum else f"[{minimum}"
    if maximum is None:
        wanted = f"> {minimum}" if exclusive_minimum else f">= {minimum}"
    else:
        wanted = f"in {low}, {maximum})"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value) and (value > minimum if exclusive_minimum else value >= minimum)
        ok = ok and (maximum is None or value < maximum)
    if not ok:
        raise ValueError(f"`{owner}.{name}` must be a number {wanted}. Received: {name}={value!r}")


def check_bool(owner: str, name: str, value) -> None:
    """Raises unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"`{owner}.{name}` must be True or False. Received: {name}={value!r}")
