"""One exception tree for numcheck, so callers can catch what they mean.

``NumcheckError`` is the root. ``UsageError`` is a caller's mistake (an unknown format, a bad
argument): its message names the argument and the remedy. The CLI maps ``UsageError`` to exit 2.
"""
from __future__ import annotations


class NumcheckError(Exception):
    """Root of every error numcheck raises on purpose."""


class UsageError(NumcheckError, ValueError):
    """A caller passed something numcheck cannot use; the message says what and how to fix it."""
