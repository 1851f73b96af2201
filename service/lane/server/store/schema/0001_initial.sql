-- The lane service's schema. Protobuf bodies are stored encoded (bytea) exactly as they are
-- streamed; columns that commands filter or lock on are plain columns.

CREATE TABLE lanes (
    lane_id              text PRIMARY KEY,
    -- The lane's revision counter: the revision of its newest event. Incremented only inside
    -- the committing transaction, under SELECT ... FOR UPDATE on this row.
    revision             bigint NOT NULL DEFAULT 0,
    -- Events with revision <= retention_floor have been removed by retention.
    retention_floor      bigint NOT NULL DEFAULT 0,
    tip_id               text,
    configuration        bytea NOT NULL,           -- lane.v1.LaneConfiguration
    message_count        bigint NOT NULL DEFAULT 0,
    usage_totals         bytea NOT NULL,           -- lane.v1.Usage
    current_operation_id text,
    last_operation_id    text,
    faulted              boolean NOT NULL DEFAULT false,
    next_inbox_position  bigint NOT NULL DEFAULT 0,
    created_time         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE entries (
    lane_id   text NOT NULL REFERENCES lanes ON DELETE CASCADE,
    entry_id  text NOT NULL,
    parent_id text,
    seq       bigint NOT NULL,
    -- The Entry payload kind: the transcript walk stops at the newest 'compaction'.
    kind      text NOT NULL,
    body      bytea NOT NULL,                      -- lane.v1.Entry
    PRIMARY KEY (lane_id, entry_id)
);

CREATE TABLE inbox (
    lane_id  text NOT NULL REFERENCES lanes ON DELETE CASCADE,
    entry_id text NOT NULL,
    position bigint NOT NULL,
    body     bytea NOT NULL,                       -- lane.v1.QueuedItem
    PRIMARY KEY (lane_id, entry_id)
);

CREATE TABLE operations (
    operation_id   text PRIMARY KEY,
    lane_id        text NOT NULL REFERENCES lanes ON DELETE CASCADE,
    kind           smallint NOT NULL,              -- lane.v1.OperationKind
    started_time   timestamptz NOT NULL,
    from_tip_id    text,
    settings       bytea NOT NULL,                 -- lane.v1.RunSettings
    cancel_requested boolean NOT NULL DEFAULT false,
    phase          text NOT NULL,                  -- idle | turn_open | tools
    continuation   text NOT NULL,                  -- need_assistant | may_finish
    turn_id        text,
    batch_entry_id text,                           -- the assistant entry of the tool batch
    result         bytea                           -- lane.v1.OperationResult once ended
);
CREATE INDEX operations_lane ON operations (lane_id);

CREATE TABLE tool_calls (
    operation_id     text NOT NULL REFERENCES operations ON DELETE CASCADE,
    source_index     integer NOT NULL,
    turn_id          text NOT NULL,
    tool_call_id     text NOT NULL,
    tool_name        text NOT NULL,
    result_entry_id  text NOT NULL,
    status           text NOT NULL,                -- planned | effect_pending | outcome_ready | completed
    replay           smallint NOT NULL DEFAULT 0,  -- lane.v1.ReplayPolicy
    arguments_json   text,                         -- effective args, written by the intent commit
    progress         bytea,                        -- lane.v1.ToolResult: latest tool_update
    checkpoint       bytea,                        -- lane.v1.ToolResult: latest checkpoint update
    result_message   bytea,                        -- lane.v1.ToolResultMessage: the staged result
    terminate        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (operation_id, source_index)
);

CREATE TABLE usage_rows (
    lane_id    text NOT NULL REFERENCES lanes ON DELETE CASCADE,
    usage_id   text NOT NULL,
    seq        bigint NOT NULL,
    body       bytea NOT NULL,                     -- lane.v1.UsageRow
    PRIMARY KEY (lane_id, usage_id)
);

CREATE TABLE events (
    lane_id     text NOT NULL REFERENCES lanes ON DELETE CASCADE,
    revision    bigint NOT NULL,
    -- The last revision of the commit this event belongs to: a group is never split.
    group_end   bigint NOT NULL,
    kind        text NOT NULL,
    body        bytea NOT NULL,                    -- lane.v1.HarnessEvent, encoded once at commit
    commit_time timestamptz NOT NULL,
    PRIMARY KEY (lane_id, revision)
);

CREATE TABLE requests (
    lane_id      text NOT NULL,
    request_id   text NOT NULL,
    method       text NOT NULL,
    request_hash bytea NOT NULL,
    response     bytea NOT NULL,
    created_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane_id, request_id)
);
