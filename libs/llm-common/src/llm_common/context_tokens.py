"""Restoring a context variable from a handler that may end in another context."""

from __future__ import annotations

import contextlib
from contextvars import Token
from typing import Any


def restore(*tokens: Token[Any]) -> None:
    """Reset each variable to what it was before its `set`, where that is possible.

    grpc.aio does not close an async-generator handler that is cancelled while it waits at a
    `yield`; the garbage collector closes it later, in another context, where a reset raises
    ValueError. That context dies with the stream, so there is nothing to restore there.
    """
    for token in tokens:
        with contextlib.suppress(ValueError):
            token.var.reset(token)
