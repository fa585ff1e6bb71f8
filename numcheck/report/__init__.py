"""Reports of records: the verify and compare tables and the markdown report (``markdown``), the
self-contained HTML report of a results file (``html``). Families add their own sections."""
