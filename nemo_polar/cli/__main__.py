"""``python -m nemo_polar.cli``: the ``polar`` command."""

import sys

from nemo_polar.cli import main

sys.exit(main())
