"""``python -m pto.cli`` (and ``torchrun ... -m pto.cli``): the command line."""

import sys

from pto.cli.main import main

sys.exit(main())
