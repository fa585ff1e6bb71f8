"""``python -m numcheck``: the same as the ``numcheck`` console script."""
import sys

from .cli import main

sys.exit(main())
