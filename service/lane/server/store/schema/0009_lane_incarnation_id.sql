-- Every lane row names its incarnation: a new number each time a lane is created or imported
-- under its id (a lane deleted and created again is a new incarnation). The service streams it
-- (LaneSnapshot.incarnation), refuses a WatchLane resume from another incarnation, tells a
-- deletion of one incarnation from a lane created again under the id, and numbers fencing
-- tokens from it, so a lease of a deleted lane never holds a run of the new one.
-- Rows that exist already get a number each (a volatile default is computed per row).
ALTER TABLE lanes ADD COLUMN incarnation bigint NOT NULL DEFAULT nextval('lane_incarnation');
