"""Front ends, thin over the library: the pytest plugin (``plugin``) and the suites' per-case
context (``context``), the command line (``cli``), ``numcheck init`` (``scaffold``), progress
lines (``progress``), the user's pytest configuration (``userconfig``), where the built-in suites
and goldens are (``builtin``), the hypothesis search (``search``) and process tuning
(``process``). The library never imports this package."""
