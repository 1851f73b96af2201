"""What psycopg spends turning a commit statement's parameters into what it sends, with the
array parameters in binary (as the store sends them) beside the same arrays in text (the
baseline: psycopg's default for a list).

The statements are the store's own, recorded by :func:`bench.replay.record` (the domain steps
and :func:`~lane.server.store.lane_writes.commit_statement`, as the commands run them): every
commit of a run of 5 turns x 4 tool calls (114 statements, arrays of 2 to 4 rows), and the largest
commit of a run whose one turn asks for 256 calls (settling the assistant message: 256 tool
call rows and their events). Each is converted and dumped as ``cursor.execute`` would
(placeholders to ``$n``, every parameter through its dumper, with a connection's adapters),
without being sent. Prints; asserts nothing. A few seconds after the embedded PostgreSQL
starts::

    python -m bench.statement_dump [--database-url URL]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence

import psycopg
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from bench.commit_throughput import provision_database
from bench.entry import add_database_url, run_benchmark
from bench.replay import record
from lane.server.store.lane_writes import CommitStatement

ROUNDS = 20


def _as_text(sql: str) -> str:
    """``sql`` with its binary placeholders (``%(name)b``) as psycopg's default ``%(name)s``."""
    return re.sub(r"%\((\w+)\)b", r"%(\1)s", sql)


def per_statement(
    conn: psycopg.Connection[object], statements: Sequence[CommitStatement], text: bool
) -> float:
    """Microseconds to convert and dump one of ``statements`` (best of ROUNDS passes)."""
    sqls = [_as_text(s.sql) if text else s.sql for s in statements]
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for sql, statement in zip(sqls, statements, strict=True):
            query = PostgresQuery(Transformer.from_context(conn))
            query.convert(sql, statement.params)
            query.dump(statement.params)
        best = min(best, time.perf_counter() - start)
    return best / len(statements) * 1e6


async def main(args: argparse.Namespace) -> int:
    ordinary = [commit.statement for commit in record("dump-lane", 4, 5).run]
    wide = max(
        (commit.statement for commit in record("dump-wide", 256, 1).run),
        key=lambda s: sum(len(v) for v in s.params.values() if isinstance(v, list)),
    )
    async with provision_database(args.database_url) as db:
        with psycopg.connect(db.url) as conn:
            rows = [
                (f"{len(ordinary)} statements of a 4-call run, per statement", ordinary),
                ("the 256-call settlement (one statement)", [wide]),
            ]
            print(f"converting and dumping a commit statement's parameters (best of {ROUNDS}):")
            for label, statements in rows:
                text = per_statement(conn, statements, text=True)
                binary = per_statement(conn, statements, text=False)
                print(f"  {label}")
                print(f"    arrays in text (baseline)  {text:10.1f} µs")
                print(f"    arrays in binary           {binary:10.1f} µs  ({binary / text:.2f} x)")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.statement_dump",
        description="psycopg's cost of a commit statement's parameters, arrays binary vs text.",
    )
    add_database_url(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(run_benchmark(parse_args, main))
