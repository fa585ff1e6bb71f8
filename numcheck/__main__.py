"""``python -m numcheck``: the same as the ``numcheck`` console script."""
import sys

from numcheck.frontends.cli import main

sys.exit(main())
