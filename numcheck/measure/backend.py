"""``njit``: numba.njit(nogil=True) with numba's on-disk cache, or without it where numba finds
no writable place for one (numcheck installed read-only and no writable user cache directory:
there ``cache=True`` raises RuntimeError when the function is decorated, which would fail the
import of every module with a compiled loop). Imports numba: callers that must survive its
absence import this module lazily or inside ``try``."""
from __future__ import annotations

import numba


def njit(**kw):
    def deco(f):
        try:
            return numba.njit(nogil=True, cache=True, **kw)(f)
        except RuntimeError:   # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, **kw)(f)
    return deco
