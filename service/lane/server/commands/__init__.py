"""The application layer: one coroutine per command, each running the command's domain step as
one transaction through the store and returning a typed result (see base.py and
docs/architecture.md). It uses the domain, the store and the hub; the gRPC layer (lane.server.api)
uses it. No gRPC here."""
