"""``python -m filesink``: the ``filesink`` command (:mod:`filesink.cli.main`)."""

import sys

from .cli.main import main

sys.exit(main())
