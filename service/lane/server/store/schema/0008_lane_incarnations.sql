-- Lanes can be deleted (DeleteLane) and their ids used again. A process keeps the lanes it
-- commanded with the version it read, and commits on such a copy only while the lane is still
-- at that version (0005): a lane created again under the same id must never reach a version an
-- old copy holds. So every new lane row starts its versions in a range of its own: a sequence
-- number times 2^32 (rows made before this migration are below 2^32).
CREATE SEQUENCE lane_incarnation;
ALTER TABLE lanes ALTER COLUMN version SET DEFAULT nextval('lane_incarnation') * 4294967296;
