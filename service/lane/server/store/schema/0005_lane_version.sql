-- A version on every lane, bumped by every write to the rows a command loads (the lane, its
-- inbox, its operations and their tool calls, its entries). A service process keeps the lanes
-- it commands in memory and writes each command as one statement that checks the version it
-- read: a stale copy is never used, it only costs a reload under the lane lock.
--
-- The service bumps the version itself, in that statement; its connections say so with the
-- session setting lane.writer = 'service'. Any other writer (an operator's psql, a repair
-- script, a test corrupting a row on purpose) bumps it through the triggers below, so even a
-- hand edit of a tool call invalidates every process's copy of its lane.

ALTER TABLE lanes ADD COLUMN version bigint NOT NULL DEFAULT 0;

CREATE FUNCTION lane_version_bump_self() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END $$;

CREATE TRIGGER lanes_version_outside_writer BEFORE UPDATE ON lanes FOR EACH ROW
    WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump_self();

-- For tables keyed by the lane.
CREATE FUNCTION lane_version_bump() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    UPDATE lanes SET version = version + 1
        WHERE namespace = r.namespace AND lane_id = r.lane_id;
    RETURN NULL;
END $$;

-- For tool_calls, keyed by their operation.
CREATE FUNCTION lane_version_bump_by_operation() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    UPDATE lanes l SET version = l.version + 1
        FROM operations o
        WHERE o.namespace = r.namespace AND o.operation_id = r.operation_id
          AND l.namespace = o.namespace AND l.lane_id = o.lane_id;
    RETURN NULL;
END $$;

CREATE TRIGGER inbox_version_outside_writer AFTER INSERT OR UPDATE OR DELETE ON inbox
    FOR EACH ROW WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump();
CREATE TRIGGER operations_version_outside_writer AFTER INSERT OR UPDATE OR DELETE ON operations
    FOR EACH ROW WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump();
CREATE TRIGGER entries_version_outside_writer AFTER INSERT OR UPDATE OR DELETE ON entries
    FOR EACH ROW WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump();
CREATE TRIGGER tool_calls_version_outside_writer AFTER INSERT OR UPDATE OR DELETE ON tool_calls
    FOR EACH ROW WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump_by_operation();
