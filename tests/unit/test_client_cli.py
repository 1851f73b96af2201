"""The ``lane`` command line without a service: targets, help texts, reach diagnostics."""

from __future__ import annotations

import argparse
import subprocess
import sys

import grpc
import pytest
from lane.client.cli import build_parser
from lane.client.errors import LaneError
from lane.client.reach import cause_of, explained, normalize_target


def test_targets_get_the_default_port() -> None:
    assert normalize_target("localhost") == "localhost:50051"
    assert normalize_target("10.1.2.3:7000") == "10.1.2.3:7000"
    assert normalize_target("[::1]") == "[::1]:50051"
    assert normalize_target("::1") == "[::1]:50051"
    assert normalize_target("[::1]:7") == "[::1]:7"
    assert normalize_target("unix:/tmp/lane.sock") == "unix:/tmp/lane.sock"
    assert normalize_target("dns:///lanes.example:443") == "dns:///lanes.example:443"


def test_every_command_has_a_description_and_the_connection_options() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = set(commands.choices)
    assert names >= {"serve", "watch", "snapshot", "lanes", "send", "abort", "demo"}
    for name, command in commands.choices.items():
        assert command.description and len(command.description) > 40, name
        helps = command.format_help()
        if name != "serve":
            for variable in ("LANE_TARGET", "LANE_TLS", "LANE_CA_FILE", "LANE_TOKEN"):
                assert f"${variable}" in helps, (name, variable)
            assert "$LANE_CLIENT_CERT_FILE" in helps and "$LANE_CONNECT_TIMEOUT" in helps


def test_transport_failures_are_explained() -> None:
    refused = LaneError(
        grpc.StatusCode.UNAVAILABLE,
        message="failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused",
    )
    assert cause_of(refused) == "connection refused"
    plaintext_to_tls = LaneError(
        grpc.StatusCode.UNAVAILABLE,
        message="failed to connect to all addresses; last error: UNAVAILABLE: "
        "ipv4:127.0.0.1:5: Socket closed",
    )
    assert "--tls" in str(explained(plaintext_to_tls, "h:5"))
    shutting_down = LaneError(
        grpc.StatusCode.UNAVAILABLE, "SERVER_SHUTTING_DOWN", "the server is shutting down"
    )
    assert cause_of(shutting_down) == "the service is shutting down"
    refused_lane = LaneError(grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND", "lane x not found")
    assert str(explained(refused_lane, "h:1")) == str(refused_lane)


def test_a_url_target_says_drop_the_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    from lane.client.cli import main

    assert main(["lanes", "--target", "http://127.0.0.1:50051"]) == 2
    said = capsys.readouterr().err
    assert "drop the scheme ('127.0.0.1:50051')" in said and "unknown host" not in said
    assert main(["lanes", "--target", "https://lanes.example:443/"]) == 2
    assert "add --tls" in capsys.readouterr().err


def test_watch_help_lists_the_keys() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = " ".join(commands.choices["watch"].format_help().split())
    for key in ("PageUp/PageDown", "Up/Down arrows", "Home", "End", "Escape", "q or Ctrl-C"):
        assert key in helps, key


def test_agent_help_lists_the_provider_timeouts() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = commands.choices["agent"].format_help()
    for flag in ("--model-connect-timeout", "--model-read-timeout", "--max-retry-after"):
        assert flag in helps, flag
    args = parser.parse_args(["agent", "--model", "openai:m", "--model-read-timeout", "5", "x"])
    assert (args.model_connect_timeout, args.model_read_timeout) == (10.0, 5.0)
    assert args.max_retry_after == 60.0


def test_a_missing_provider_sdk_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from lane.client.models import model_from_spec

    monkeypatch.delitem(sys.modules, "lane.client.models.openai", raising=False)
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai fails
    with pytest.raises(ImportError) as missing:
        model_from_spec("openai:gpt-test", api_key="k")
    said = str(missing.value)
    assert "pip install openai" in said and "./clients/python[openai]" in said
    assert "lane-client[" not in said  # not published: never suggested


def test_the_cli_does_not_import_grpc_before_it_sets_its_log_level() -> None:
    """gRPC's C core printed a raw handshake log line before the CLI's own message: the CLI
    turns its logs off, which works only if gRPC was not imported yet."""
    code = "import sys, lane.client.cli; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_lane_not_found_with_a_token_hints_at_namespaces() -> None:
    missing = LaneError(grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND", "lane x does not exist")
    assert str(explained(missing, "h:1")) == str(missing)  # no token: no namespaces to speak of
    hinted = str(explained(missing, "h:1", token=True))
    assert hinted.startswith(str(missing)) and "its own namespace's lanes" in hinted


def test_lane_lanes_statuses_are_the_contracts() -> None:
    from lane.client.cli import LANE_STATUSES
    from lane.client.cli_lanes import STATUSES

    assert set(LANE_STATUSES) == set(STATUSES)


def test_lane_lanes_table_shows_a_summary_in_words() -> None:
    from google.protobuf import timestamp_pb2
    from lane.client.cli_lanes import table
    from lane.v1 import lane_service_pb2 as pb
    from lane.v1 import messages_pb2, snapshot_pb2

    line = pb.LaneSummary(
        lane_id="l1",
        revision=7,
        status=pb.LANE_STATUS_RETRY_WAITING,
        operation_id="op",
        running_tool_calls=2,
        usage_totals=messages_pb2.Usage(total_tokens=12345),
        last_result_status=snapshot_pb2.OPERATION_RESULT_STATUS_FAILED,
        last_activity_time=timestamp_pb2.Timestamp(seconds=1000),
    )
    header, row = table([line], now=1000 + 3 * 3600 + 5)
    assert header.split()[:2] == ["LANE", "STATUS"]
    assert row.split() == ["l1", "retry-waiting", "7", "op", "2", "12,345", "failed", "3h", "ago"]
