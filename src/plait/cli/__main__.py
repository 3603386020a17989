"""``python -m plait.cli``: the ``plait`` command without the console script."""

from __future__ import annotations

import sys

from plait.cli import main

if __name__ == "__main__":
    sys.exit(main())
