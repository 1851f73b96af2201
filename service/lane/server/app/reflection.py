"""Server reflection, both versions, with the types of the service's error details.

grpcio-reflection serves ``grpc.reflection.v1alpha.ServerReflection`` only; current tools
(``buf curl``, grpcurl) ask for ``grpc.reflection.v1.ServerReflection`` first. The two
protocols are the same messages under another package name, so :func:`add_reflection` serves
v1 with the v1alpha servicer and messages (identical on the wire), and registers a v1 copy of
the v1alpha file so v1 itself can be described.

Errors carry ``google.rpc.ErrorInfo`` (and may carry other ``google.rpc`` details) packed in
``Any``: a tool decodes them only when their file is in the schema it fetched, and no service
file imports ``google/rpc/error_details.proto``. So each file answer (and its dependencies)
also carries that file and its own dependencies: ``buf curl`` then prints ``ErrorInfo``
decoded instead of base64.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

__all__ = ["REFLECTION_V1", "REFLECTION_V1ALPHA", "add_reflection"]

REFLECTION_V1ALPHA: str = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def add_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both
    reflection services."""
    _register_v1_file()
    names = (*service_names, REFLECTION_V1, REFLECTION_V1ALPHA)
    servicer = _WithErrorDetails(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


class _WithErrorDetails(ReflectionServicer):  # type: ignore[misc]
    """Every file answer also carries ``google/rpc/error_details.proto`` and its imports."""

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        return _with_error_details(super()._file_by_filename(request, filename))

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        return _with_error_details(super()._file_containing_symbol(request, fully_qualified_name))


def _with_error_details(
    response: reflection_pb2.ServerReflectionResponse,
) -> reflection_pb2.ServerReflectionResponse:
    if not response.HasField("file_descriptor_response"):
        return response
    files = response.file_descriptor_response.file_descriptor_proto
    present = {descriptor_pb2.FileDescriptorProto.FromString(raw).name for raw in files}
    for extra in _error_detail_files():
        if extra.name not in present:
            proto = descriptor_pb2.FileDescriptorProto()
            extra.CopyToProto(proto)
            files.append(proto.SerializeToString())
    return response


def _error_detail_files() -> list[Any]:
    """``google/rpc/error_details.proto`` and every file it imports, imports first."""
    ordered: list[Any] = []

    def visit(file: Any) -> None:
        for dependency in file.dependencies:
            visit(dependency)
        if file not in ordered:
            ordered.append(file)

    visit(error_details_pb2.DESCRIPTOR)
    return ordered


def _register_v1_file() -> None:
    """Add the v1 reflection file to the default pool: the v1alpha file under v1's names."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    for message in proto.message_type:
        for message_field in message.field:
            if message_field.type_name:  # scalar fields have none, and must not get one
                message_field.type_name = message_field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.Add(proto)
