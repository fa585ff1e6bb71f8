"""Kernel forensics, the ``fingerprint`` family: ``kernel_fingerprint`` (``nc.fingerprint``: how
a kernel accumulates, from crafted probes; imports torch) and ``fingerprint_rules`` (the family's
golden rule and report sections; torch-free)."""
