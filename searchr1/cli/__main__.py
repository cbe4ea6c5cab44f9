"""``python -m searchr1.cli ...``: the ``searchr1`` command without its console script."""

import sys

from searchr1.cli.main import main

sys.exit(main())
