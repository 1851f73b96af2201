"""``python -m lane.client``: the ``lane`` command (for environments without the script)."""

from __future__ import annotations

import sys

from lane.client.cli import main

sys.exit(main())
