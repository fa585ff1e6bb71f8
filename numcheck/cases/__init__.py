"""Cases: what one run of an op is, the fixed case grids (``grid``: ``Case``, ``Grid``,
``CASE_SETS``), and the inputs a case is built from (``inputs``: distributions, casts, layouts,
case ids, pairwise designs, hypothesis strategies). The first stage of the flow.

``Case``, ``Grid``, ``make_grid`` and ``CASE_SETS`` are re-exported here (torch-free: the
readers of goldens import this package without torch).
"""
from numcheck.cases.grid import CASE_SETS, Case, Grid, make_grid

__all__ = ["CASE_SETS", "Case", "Grid", "make_grid"]
