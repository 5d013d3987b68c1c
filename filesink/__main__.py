"""``python -m filesink``: the ``filesink`` command (:mod:`filesink.cli`)."""

import sys

from .cli import main

sys.exit(main())
