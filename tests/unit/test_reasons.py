"""One list of refusal reasons: ``lane.v1.Reason`` (protos/lane/v1/reasons.proto).

docs/errors.md, the proto and the service agree on the set of reasons and on the one status
code of each; the Python client's typed errors are chosen from it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from lane.client import errors
from lane.client.errors import LaneError, reason_name, status_error
from lane.v1 import reasons_pb2
from lane.v1.reasons_pb2 import Reason

ROOT = Path(__file__).resolve().parents[2]


def documented() -> dict[str, list[str]]:
    """docs/errors.md's table: reason → every code it is listed under."""
    codes: dict[str, list[str]] = {}
    code = ""
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| code"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        code = cells[0] or code
        for reason in re.findall(r"`([A-Z][A-Z_]+)`", cells[1]):
            codes.setdefault(reason, []).append(code)
    return codes


def in_proto() -> dict[str, str]:
    """reasons.proto: reason → the code its comment names."""
    text = (ROOT / "protos" / "lane" / "v1" / "reasons.proto").read_text()
    found = re.findall(r"// ([A-Z_]{2,})(?: \([^)\n]*\))?\n\s*REASON_([A-Z_]+) = \d+;", text)
    return {reason: code for code, reason in found}


def enum_reasons() -> set[str]:
    return {reason_name(v) for v in Reason.values() if v != reasons_pb2.REASON_UNSPECIFIED}


def test_the_docs_and_the_enum_list_the_same_reasons() -> None:
    assert set(documented()) == enum_reasons()


def test_every_reason_has_one_code_and_the_proto_names_it() -> None:
    docs = documented()
    assert {reason: codes for reason, codes in docs.items() if len(codes) != 1} == {}
    assert in_proto() == {reason: codes[0] for reason, codes in docs.items()}


def _raised_reasons() -> set[str]:
    """Every reason literal the service raises or answers with."""
    refusals = {
        "LaneError",
        "InvalidArgument",
        "NotFound",
        "AlreadyExists",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "ResourceExhausted",
        "Corruption",
    }
    found: set[str] = set()
    for path in (ROOT / "service").rglob("*.py"):
        tree = ast.parse(path.read_text())
        refusals |= {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id in refusals for b in node.bases)
        }
    for path in (ROOT / "service").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            index = 0 if name in refusals else 1 if name in ("rich_status", "status_of") else None
            if index is None or len(node.args) <= index:
                continue
            arg = node.args[index]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_reason_the_service_gives_is_in_the_enum() -> None:
    raised = _raised_reasons()
    assert len(raised) > 40  # the scan finds the service's refusals
    assert raised - enum_reasons() == set()


def _status(code: int, reason: str) -> status_pb2.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="lane.v1"))
    return status_pb2.Status(code=code, message="refused", details=[detail])


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (code_pb2.FAILED_PRECONDITION, "LEASE_HELD", errors.LeaseHeld),
        (code_pb2.ABORTED, "STALE_LEASE", errors.StaleLease),
        (code_pb2.FAILED_PRECONDITION, "OPERATION_CANCELLED", errors.OperationCancelled),
        (code_pb2.FAILED_PRECONDITION, "NOT_REPLAYABLE", errors.NotReplayable),
        (code_pb2.NOT_FOUND, "LANE_NOT_FOUND", errors.LaneNotFound),
        (code_pb2.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE", errors.TooLarge),
        (code_pb2.RESOURCE_EXHAUSTED, "SNAPSHOT_TOO_LARGE", errors.TooLarge),
        (code_pb2.UNAUTHENTICATED, "TOKEN_UNKNOWN", errors.Unauthenticated),
        (code_pb2.FAILED_PRECONDITION, "WRONG_RUN_PHASE", LaneError),
        (code_pb2.FAILED_PRECONDITION, "A_REASON_FROM_THE_FUTURE", LaneError),
    ],
)
def test_a_refusal_is_raised_as_the_class_of_its_reason(
    code: int, reason: str, expected: type[LaneError]
) -> None:
    error = status_error(_status(code, reason))
    assert type(error) is expected
    assert error.reason == reason and error.code.value[0] == code
    known = f"REASON_{reason}" in Reason.keys()  # noqa: SIM118 (an enum wrapper, no __contains__)
    assert error.reason_code == (Reason.Value(f"REASON_{reason}") if known else 0)


def test_each_typed_error_stands_for_reasons_no_other_does() -> None:
    typed = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, LaneError) and cls.reasons
    ]
    seen: dict[int, type[LaneError]] = {}
    for cls in typed:
        for reason in cls.reasons:
            assert reason not in seen, (cls, seen.get(reason))
            seen[reason] = cls
    assert len(typed) >= 10 and all(cls.__name__ in errors.__all__ for cls in typed)


def test_a_transport_failure_has_no_reason() -> None:
    error = status_error(status_pb2.Status(code=code_pb2.UNAVAILABLE, message="gone"))
    assert type(error) is LaneError and error.code == grpc.StatusCode.UNAVAILABLE
    assert error.reason == "" and error.reason_code == reasons_pb2.REASON_UNSPECIFIED
