"""`python -m zsim`: the same as the `zsim` command."""

import sys

from zsim.cli import main

sys.exit(main())
