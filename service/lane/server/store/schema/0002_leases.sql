-- Run ownership: a lease with a fencing token per operation, and the recovery flag of a run
-- taken over mid-batch.
ALTER TABLE operations
    ADD COLUMN lease_token   bigint NOT NULL DEFAULT 0,     -- highest token issued; 0 = never leased
    ADD COLUMN lease_holder  text,                          -- NULL once released
    ADD COLUMN lease_expires timestamptz,
    ADD COLUMN recovering    boolean NOT NULL DEFAULT false;

-- The reconciler looks for open runs whose lease lapsed.
CREATE INDEX operations_open_leases ON operations (lease_expires)
    WHERE lease_token > 0 AND phase <> 'ended';
