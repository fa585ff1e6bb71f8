"""Measurement: ``ErrorStats`` (``errorstats``, torch-free) and ``error_stats`` (``stats``) with
its compiled CPU (``_stats_numba``) and CUDA (``_stats_triton``) passes, chosen by ``backend``
(the one selector; docs/DESIGN.md); element-level views of one output (``elements``); the numerics state a kernel runs under (``numerics``) and
the machine the numbers come from (``environment``)."""
