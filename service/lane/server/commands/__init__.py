"""The application layer: one command per mutating RPC, taking the request message and
answering with the response message, its domain step run as one transaction through the store
(see base.py and docs/architecture.md). It uses the domain, the store and the hub; the gRPC layer
(lane.server.api) uses it. No gRPC here."""
