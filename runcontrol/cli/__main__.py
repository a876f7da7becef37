"""``python -m runcontrol.cli``: every command but those that run on Ray (``actors/cli.py``)."""

import sys

from . import main

sys.exit(main())
