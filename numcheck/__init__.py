"""numcheck: numerical validation of training kernels and low-precision paths.

Public names (docs/DESIGN.md, "Public contract"): ``round_to``, ``ulp_distance``,
``error_stats`` / ``ErrorStats``, ``verify`` / ``Verification``, ``kernel``, ``op``, the format
table ``FORMATS`` and the exception tree (``NumcheckError``, ``UsageError``).
"""
from .catalog import kernel, op
from .errors import NumcheckError, UsageError
from .formats import FORMATS, Format, round_to, ulp_distance
from .policy import Policy
from .run import Verification, verify
from .stats import ErrorStats, error_stats
from .version import __version__

__all__ = ["FORMATS", "ErrorStats", "Format", "NumcheckError", "Policy", "UsageError",
           "Verification", "error_stats", "kernel", "op", "round_to", "ulp_distance", "verify",
           "__version__"]
