"""Benchmarks of the lane service, each printing the service figure beside a baseline measured
in the same run on the same machine (DESIGN.md §8). They print; they never assert timing.

- :mod:`bench.commit_throughput`: lifecycle commits/s through gRPC versus PostgreSQL's own
  single-row commit rate (pgbench) at the same concurrency.
"""
