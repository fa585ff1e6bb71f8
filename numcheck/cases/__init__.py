"""Cases: what one run of an op is, the fixed case grids (``grid``: ``Case``, ``Grid``,
``CASE_SETS``) and their designs (``design``: pairwise and full products, case ids), the inputs
a case is built from (``inputs``: seeds, distributions, casts, layouts, input digests) and the
hypothesis search's strategies and profiles (``strategies``). The first stage of the flow.

``Case``, ``Grid``, ``make_grid`` and ``CASE_SETS`` are re-exported here (torch-free: the
readers of goldens import this package without torch).
"""
from numcheck.cases.grid import CASE_SETS, Case, Grid, make_grid

__all__ = ["CASE_SETS", "Case", "Grid", "make_grid"]
