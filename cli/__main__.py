"""`python -m cli ...` is `layerswap ...`."""

import sys

from cli import main

sys.exit(main())
