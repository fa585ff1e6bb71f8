"""Goldens: the parquet store (``store``), the regression rules (``regression``), a run's golden
bookkeeping (``session``) and CI shards (``shards``). Torch-free: ``numcheck compare``, ``show``
and ``report`` read goldens without importing torch."""
