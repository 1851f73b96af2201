"""The contract's numbers: the limits and defaults the service enforces and clients plan by.

Defined once, here, beside the generated contract (``lane.v1``) and like it imported by both
sides: the service (``service/lane/server/domain/limits.py``,
``service/lane/server/api/validation.py``, ``service/lane/server/app``) and the clients
(``lane.client``), which must not depend on the server. Plain constants, no imports: importing this
module costs nothing. docs/limits.md says what each one refuses and why it is what it is.
"""

from __future__ import annotations

from typing import Final

#: The largest gRPC message either side sends or receives: gRPC's default receive limit, so
#: any client with default settings receives everything. Larger answers and stream messages
#: are sent in parts (lane.v1.MessagePart).
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
#: One payload of a request (a message, a tool result, arguments, an entry), encoded.
MAX_PAYLOAD_BYTES: Final = 512 * 1024
#: An operation error (EndRun, EndCompaction), encoded.
MAX_ERROR_BYTES: Final = 64 * 1024
#: A lane's inbox, its queued messages together, encoded (RESOURCE_EXHAUSTED ``QUEUE_FULL``): a
#: budget that protects the database, as every enqueue writes the whole queue again (its
#: queue_update event carries it).
MAX_INBOX_BYTES: Final = 32 * 1024 * 1024

#: A lease's length when a request asks for 0.
DEFAULT_LEASE_SECONDS: Final = 30
#: The longest lease a request may ask for.
MAX_LEASE_SECONDS: Final = 3600

#: ListLanes: the page size when a request asks for 0, and the largest it may ask for.
DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 1000
#: WatchLanes and ListLanes: lane ids and statuses one request may name, together.
MAX_LANE_FILTERS: Final = 1000

#: WatchLane streams one server process serves at once, of one lane and in all (the defaults
#: of ``LANE_MAX_WATCHERS_PER_LANE`` and ``LANE_MAX_WATCHERS``).
DEFAULT_MAX_WATCHERS_PER_LANE: Final = 1000
DEFAULT_MAX_WATCHERS: Final = 10_000
#: ... and of one namespace (``LANE_MAX_WATCHERS_PER_NAMESPACE``; applied when the tokens name
#: two or more namespaces): half the process's, so one tenant never holds them all.
DEFAULT_MAX_WATCHERS_PER_NAMESPACE: Final = 5_000
#: DriveLane sessions one server process serves at once, in all and of one namespace
#: (``LANE_MAX_SESSIONS``, ``LANE_MAX_SESSIONS_PER_NAMESPACE``).
DEFAULT_MAX_SESSIONS: Final = 2_000
DEFAULT_MAX_SESSIONS_PER_NAMESPACE: Final = 1_000
#: ExportLane and ImportLane calls one server process serves at once, in all and of one
#: namespace (``LANE_MAX_TRANSFERS``, ``LANE_MAX_TRANSFERS_PER_NAMESPACE``).
DEFAULT_MAX_TRANSFERS: Final = 16
DEFAULT_MAX_TRANSFERS_PER_NAMESPACE: Final = 8

#: An idle watch gets a heartbeat at least this often.
HEARTBEAT_SECONDS: Final = 10.0
#: Clients may send keepalive pings this often at most; faster pingers are sent GOAWAY.
MIN_CLIENT_PING_INTERVAL_MS: Final = 10_000

#: DriveLane: the commands of one stream in flight at once (read by the service, not yet
#: answered), however they are framed; past it the service stops reading the stream.
MAX_DRIVE_COMMANDS_IN_FLIGHT: Final = 64
#: DriveLane: the most commands one DriveLaneRequest carries in its ``batch`` (the in-flight
#: bound: a batch never waits for more slots than a stream has).
MAX_DRIVE_BATCH: Final = MAX_DRIVE_COMMANDS_IN_FLIGHT
#: The header the service sends when it admits a DriveLane stream, valued MAX_DRIVE_BATCH: a
#: client sends batches only once it has seen it (an older service has no batches).
DRIVE_BATCH_HEADER: Final = "lane-drive-batch"
