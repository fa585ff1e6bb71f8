"""Verdicts: the one verdict path (``judge``), the ops' rules (``policy``), the condition-aware
bound (``conditioning``), which declared convention a failing kernel follows
(``conventions``), known weaknesses by id (``findings``) and the record families (``families``:
the one place a family registers)."""
