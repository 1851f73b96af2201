-- The rest of an open run's presentation: the streaming assistant partial, a scheduled retry,
-- a deferred suspension; and the attempt number of the open turn's model call.
ALTER TABLE operations
    ADD COLUMN streaming bytea,   -- lane.v1.AssistantMessage (latest partial)
    ADD COLUMN retry     bytea,   -- lane.v1.RetryState
    ADD COLUMN deferred  bytea,   -- lane.v1.DeferredState
    ADD COLUMN attempt   integer NOT NULL DEFAULT 1,
    ADD COLUMN reason    smallint NOT NULL DEFAULT 0;  -- lane.v1.CompactionReason of a compaction
