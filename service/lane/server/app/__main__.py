"""``python -m lane.server.app``: run the lane service, configured by ``LANE_*`` variables.

See :mod:`lane.server.app.config` for the variables.
"""

import os
import sys

# Before gRPC is imported: the service forks only to exec pg_ctl (embedded PostgreSQL), which
# needs no gRPC fork handlers, and with them enabled gRPC logs a warning-like line at shutdown.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from lane.server.app.main import main

sys.exit(main())
