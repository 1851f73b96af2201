"""What a command may carry: counts and payload sizes, refused before anything is written.

- **counts** (INVALID_ARGUMENT ``TOO_MANY_*``, checked by ``service/lane/server/api/validation.py``
  before anything walks a request): tool calls per assistant message, content blocks, messages and
  tool names per request. They keep every command's work small.
- **payloads** (INVALID_ARGUMENT ``PAYLOAD_TOO_LARGE``, also
  ``service/lane/server/api/validation.py``): each message, tool result, argument text, entry and
  deferred handle a request carries is at most :data:`MAX_PAYLOAD_BYTES` encoded (an operation error
  :data:`MAX_ERROR_BYTES`).
- **the inbox** (RESOURCE_EXHAUSTED ``QUEUE_FULL``, ``lanes.enqueue``): the lane's queued
  messages together, a budget that protects the database (every enqueue writes the whole queue
  again in its queue_update event).

Nothing is refused for the size of what a commit leaves to deliver: an event group, a snapshot
or a run's durable state over one gRPC message is sent in parts (the api's framing,
``service/lane/server/api/message_parts.py``), so the domain knows nothing of messages.
"""

from __future__ import annotations

# Re-exported: the layers above read every limit from this module.
from lane.limits import MAX_ERROR_BYTES as MAX_ERROR_BYTES
from lane.limits import MAX_INBOX_BYTES as MAX_INBOX_BYTES
from lane.limits import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES

# MAX_PAYLOAD_BYTES (one payload of a request), MAX_ERROR_BYTES (an operation error: it stays in
# every snapshot as the lane's last result) and MAX_INBOX_BYTES are the contract's, shared with
# the clients: lane/limits.py.

#: Tool calls in one assistant message (INVALID_ARGUMENT ``TOO_MANY_TOOL_CALLS``). Models emit
#: at most tens of parallel calls; 256 leaves an order of magnitude beyond that, keeps every
#: per-command step over a batch (each command loads, checks and writes the whole batch)
#: around a millisecond.
MAX_TOOL_CALLS = 256
#: Content blocks in one request, all the messages it carries together
#: (INVALID_ARGUMENT ``TOO_MANY_CONTENT_BLOCKS``). Real messages hold tens of blocks; 4,096
#: bounds the per-block work a request causes (validation, settlement) to a few milliseconds.
MAX_CONTENT_BLOCKS = 4096
#: Messages in one request: StartRun prompts, AppendAssistantStream partials, a compaction's
#: retained tail (INVALID_ARGUMENT ``TOO_MANY_MESSAGES``). Each one placed or streamed is up to
#: three events.
MAX_REQUEST_MESSAGES = 256
#: Tool names in one request (a configuration's active tools, a result's added tools)
#: (INVALID_ARGUMENT ``TOO_MANY_TOOL_NAMES``).
MAX_TOOL_NAMES = 4096
