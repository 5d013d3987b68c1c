"""``python -m recovery STEP``: the steps of ``filesink recover`` (status, plan, apply) on their own."""

import sys

from .cli import main

sys.exit(main())
