"""``python -m refdec.cli``: the ``refdec`` command."""

import sys

from refdec.cli.main import main

sys.exit(main())
