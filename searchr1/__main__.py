"""``python -m searchr1`` (and ``torchrun ... -m searchr1 train``): the ``searchr1`` command."""

import sys

from searchr1.cli.main import main

sys.exit(main())
