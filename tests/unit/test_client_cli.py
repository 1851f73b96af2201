"""The ``lane`` command line without a service: targets, help texts, reach diagnostics."""

from __future__ import annotations

import argparse

import grpc
from lane.client.cli import build_parser
from lane.client.errors import LaneError
from lane.client.reach import cause_of, explain, normalize_target


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
    assert "--tls" in explain(plaintext_to_tls, "h:5")
    shutting_down = LaneError(
        grpc.StatusCode.UNAVAILABLE, "SERVER_SHUTTING_DOWN", "the server is shutting down"
    )
    assert cause_of(shutting_down) == "the service is shutting down"
    refused_lane = LaneError(grpc.StatusCode.NOT_FOUND, "LANE_NOT_FOUND", "lane x not found")
    assert explain(refused_lane, "h:1") == str(refused_lane)
