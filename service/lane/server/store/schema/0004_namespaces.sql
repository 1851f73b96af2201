-- Namespaces: every lane belongs to one, and a lane's identity becomes (namespace, lane_id).
-- Everything keyed by a lane is keyed by its namespace too, and so are operation ids (unique
-- within a namespace), so ids chosen in one namespace never collide with, or reveal, another's.
-- Lanes created before namespaces existed belong to 'default', the namespace of a service
-- running without auth.

ALTER TABLE entries    DROP CONSTRAINT entries_lane_id_fkey;
ALTER TABLE inbox      DROP CONSTRAINT inbox_lane_id_fkey;
ALTER TABLE operations DROP CONSTRAINT operations_lane_id_fkey;
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_operation_id_fkey;
ALTER TABLE usage_rows DROP CONSTRAINT usage_rows_lane_id_fkey;
ALTER TABLE events     DROP CONSTRAINT events_lane_id_fkey;

ALTER TABLE lanes      ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE entries    ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE inbox      ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE operations ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE tool_calls ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE usage_rows ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE events     ADD COLUMN namespace text NOT NULL DEFAULT 'default';
ALTER TABLE requests   ADD COLUMN namespace text NOT NULL DEFAULT 'default';

-- The service always names the namespace; a default would hide a forgotten one.
ALTER TABLE lanes      ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE entries    ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE inbox      ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE operations ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE tool_calls ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE usage_rows ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE events     ALTER COLUMN namespace DROP DEFAULT;
ALTER TABLE requests   ALTER COLUMN namespace DROP DEFAULT;

ALTER TABLE lanes      DROP CONSTRAINT lanes_pkey,
                       ADD PRIMARY KEY (namespace, lane_id);
ALTER TABLE entries    DROP CONSTRAINT entries_pkey,
                       ADD PRIMARY KEY (namespace, lane_id, entry_id);
ALTER TABLE inbox      DROP CONSTRAINT inbox_pkey,
                       ADD PRIMARY KEY (namespace, lane_id, entry_id);
ALTER TABLE operations DROP CONSTRAINT operations_pkey,
                       ADD PRIMARY KEY (namespace, operation_id);
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_pkey,
                       ADD PRIMARY KEY (namespace, operation_id, source_index);
ALTER TABLE usage_rows DROP CONSTRAINT usage_rows_pkey,
                       ADD PRIMARY KEY (namespace, lane_id, usage_id);
ALTER TABLE events     DROP CONSTRAINT events_pkey,
                       ADD PRIMARY KEY (namespace, lane_id, revision);
ALTER TABLE requests   DROP CONSTRAINT requests_pkey,
                       ADD PRIMARY KEY (namespace, lane_id, request_id);

ALTER TABLE entries    ADD FOREIGN KEY (namespace, lane_id)
                       REFERENCES lanes (namespace, lane_id) ON DELETE CASCADE;
ALTER TABLE inbox      ADD FOREIGN KEY (namespace, lane_id)
                       REFERENCES lanes (namespace, lane_id) ON DELETE CASCADE;
ALTER TABLE operations ADD FOREIGN KEY (namespace, lane_id)
                       REFERENCES lanes (namespace, lane_id) ON DELETE CASCADE;
ALTER TABLE tool_calls ADD FOREIGN KEY (namespace, operation_id)
                       REFERENCES operations (namespace, operation_id) ON DELETE CASCADE;
ALTER TABLE usage_rows ADD FOREIGN KEY (namespace, lane_id)
                       REFERENCES lanes (namespace, lane_id) ON DELETE CASCADE;
ALTER TABLE events     ADD FOREIGN KEY (namespace, lane_id)
                       REFERENCES lanes (namespace, lane_id) ON DELETE CASCADE;

DROP INDEX operations_lane;
CREATE INDEX operations_lane ON operations (namespace, lane_id);
