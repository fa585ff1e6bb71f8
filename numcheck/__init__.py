"""numcheck: numerical validation of training kernels and low-precision paths.

Public names (see ../shared/DESIGN.md, "Public contract"): ``round_to``, ``ulp_distance``,
``error_stats`` / ``ErrorStats``, and the format table ``FORMATS``.
"""
from .errors import NumcheckError, UsageError
from .formats import FORMATS, Format, round_to, ulp_distance
from .stats import ErrorStats, error_stats

__version__ = "0.1.0"

__all__ = ["FORMATS", "ErrorStats", "Format", "NumcheckError", "UsageError", "error_stats",
           "round_to", "ulp_distance", "__version__"]
