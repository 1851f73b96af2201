"""Benchmarks of the lane service, each printing the service figure beside a baseline measured
in the same run on the same machine (docs/contract.md). They print; they never assert timing.

- :mod:`bench.commit_throughput`: lifecycle commits/s through gRPC versus PostgreSQL's own
  single-row commit rate (pgbench) at the same concurrency; ``--watchers W``: also with W
  watchers attached, and the drop.
- :mod:`bench.watch_delivery`: commit -> watcher delivery latency at a given commit rate over
  many lanes and watchers, beside a raw LISTEN/NOTIFY round trip.
- :mod:`bench.watchers`: the watcher fleet (a subprocess) both of those use.
- :mod:`bench.idle_watchers`: resident memory per idle WatchLane stream, beside a minimal
  grpc.aio server holding as many idle streams.
- :mod:`bench.snapshot_cost`: a 10,000-entry transcript's snapshot through WatchLane versus
  selecting and encoding the same rows, and the service's peak memory while it streams.
- :mod:`bench.memory`: resident memory of another process from /proc (VmRSS, Pss, peaks).
"""
