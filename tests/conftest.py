"""The test suites' shared toolkit, loaded as pytest plugins from ``tests/support``:

- ``tests.support.database``: a real PostgreSQL (which one, and why, in its docstring), fresh
  databases, the migrated session store and the session's running service (``lane_server``,
  ``lane_channel``, ``lane_stub``);
- ``tests.support.lanes``: messages, reading the event log, fold == capture (``Probe``),
  error details; lifecycles in one line per step are ``lane.client.testing``'s ``LaneScript``;
- ``tests.support.servers``: more service instances (``extra_server``, ``serve``), the HTTP
  port (``http_server``, ``http_server_stub``), ``lane serve`` as a process (``serving``);
- ``tests.support.clock``: a clock tests move forward instead of sleeping;
- ``tests.support.driver_tools``: recording tools and polling for the driver SDK's tests;
- ``tests.integration.web_browser``: the web console's browser tests' service and headless
  Chromium (``web_service``, ``web_page``), one of each for the whole session.

``tests.support.refusal_matrix`` is data, imported rather than loaded: which command is
refused in which lane state, checked by the domain's and the service's refusal tests.

Loaded as plugins, their asserts are rewritten as a test's are, so a failing check inside a
helper reports its values.
"""

pytest_plugins = [
    "tests.support.database",
    "tests.support.lanes",
    "tests.support.servers",
    "tests.support.clock",
    "tests.support.driver_tools",
    "tests.integration.web_browser",
]
