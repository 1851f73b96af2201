-- Every row of a lane carries the lane's key (namespace, lane_id), and every statement about one
-- lane names it: tool calls were keyed by their operation alone. With the key on every row, the
-- tables can be distributed by it (one lane's rows on one shard, one transaction per shard).

ALTER TABLE tool_calls ADD COLUMN lane_id text;
UPDATE tool_calls t SET lane_id = o.lane_id
    FROM operations o WHERE o.namespace = t.namespace AND o.operation_id = t.operation_id;
ALTER TABLE tool_calls ALTER COLUMN lane_id SET NOT NULL;

-- Hand edits of tool calls find their lane directly now.
DROP TRIGGER tool_calls_version_outside_writer ON tool_calls;
DROP FUNCTION lane_version_bump_by_operation();
CREATE TRIGGER tool_calls_version_outside_writer AFTER INSERT OR UPDATE OR DELETE ON tool_calls
    FOR EACH ROW WHEN (current_setting('lane.writer', true) IS DISTINCT FROM 'service')
    EXECUTE FUNCTION lane_version_bump();
