-- The append-only tables (events, entries, usage_rows) drop their foreign keys to lanes.
--
-- Every row of them is inserted by the statement that also updates its lane's row, and only if
-- that update happened (service/lane/server/store/lane_writes.py: each insert selects FROM the lane
-- update's result), so a row can never name a lane that does not exist; no lane is ever
-- deleted. The keys only cost PostgreSQL a lookup of the lane row per inserted row: measured
-- with bench/commit_throughput.py, dropping the keys of these and of the mutable tables took
-- PostgreSQL's CPU per lifecycle commit from 417 to 346 us, most of it from events (1.5 rows
-- per commit). The mutable tables (inbox, operations, tool_calls) keep theirs: they are written
-- less often, and their keys still guard the rows a command reads back.
ALTER TABLE events     DROP CONSTRAINT events_namespace_lane_id_fkey;
ALTER TABLE entries    DROP CONSTRAINT entries_namespace_lane_id_fkey;
ALTER TABLE usage_rows DROP CONSTRAINT usage_rows_namespace_lane_id_fkey;
