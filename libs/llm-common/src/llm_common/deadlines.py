"""The incoming RPC's absolute deadline, kept in a ContextVar so outgoing calls inherit it."""

from __future__ import annotations

import contextvars
import time
from contextvars import ContextVar
from typing import overload

# time.monotonic() value by which the RPC being handled must finish; None when unbounded.
deadline_var: ContextVar[float | None] = ContextVar("llm_deadline", default=None)
# The work of an RPC (its downstream calls) ends this much before the caller's deadline: its
# DEADLINE_EXCEEDED then goes out as this RPC's status before any timer on the way fires. A
# stream whose response has started is otherwise cut by whichever timer fires first, and
# Envoy's cuts it with RST_STREAM, which the client reads as INTERNAL.
CUSHION_MAX_S = 0.05
CUSHION_SHARE = 0.1  # of the time left, for short deadlines


def deadline_after(timeout_s: float | None) -> float | None:
    """The monotonic deadline `timeout_s` seconds from now (None stays None)."""
    return None if timeout_s is None else time.monotonic() + timeout_s


def work_deadline(timeout_s: float | None) -> float | None:
    """The deadline for an RPC's own work: `timeout_s` from now less the cushion (None stays
    None)."""
    if timeout_s is None:
        return None
    return time.monotonic() + timeout_s - min(CUSHION_MAX_S, CUSHION_SHARE * max(timeout_s, 0.0))


def without_deadline(context: contextvars.Context | None = None) -> contextvars.Context:
    """A copy of `context` (default: the current one) with no deadline, its request id and
    trace kept: for work that outlives the RPC or serves several RPCs at once."""
    copy = context.copy() if context is not None else contextvars.copy_context()
    copy.run(deadline_var.set, None)
    return copy


def time_left() -> float | None:
    """Seconds until the current deadline (never negative), or None when there is none."""
    deadline = deadline_var.get()
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


@overload
def remaining_timeout(default: float) -> float: ...
@overload
def remaining_timeout(default: None) -> float | None: ...
def remaining_timeout(default: float | None) -> float | None:
    """The timeout for an outgoing call: min(`default`, time left of the incoming RPC)."""
    left = time_left()
    if left is None:
        return default
    return left if default is None else min(default, left)
