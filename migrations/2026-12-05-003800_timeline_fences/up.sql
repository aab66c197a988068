-- Issue 38: after a point-in-time restore (or a promotion that lost transactions) the database
-- runs on a new timeline, and everything issued on the timeline left behind after the restore
-- point is gone from it but not from the world: order numbers the providers hold trades for,
-- refund numbers, ids. `fitorder migrate` (and every start, which migrates) notices a new
-- timeline (or another cluster) and fences it (crates/db/src/fence.sql): every sequence of the
-- schema jumps ahead, so nothing issued again collides with what was lost, and the order numbers
-- that may have been issued and lost are kept here, for the reconciliation to recognise the
-- providers' payments of orders the restore lost (refunded, crates/capabilities/src/
-- reconciliation/sql/lost_orders.sql).
CREATE TABLE timeline_fences (
    id BIGSERIAL PRIMARY KEY,
    -- pg_control_system().system_identifier, as text: the cluster (kept by a physical restore).
    system_identifier TEXT NOT NULL,
    -- The timeline the database runs on, from this row on.
    timeline INT NOT NULL,
    -- The order numbers' sequence values that may have been issued on the timeline left behind
    -- and are not in `orders` ([from, to], both inclusive); NULL for the first row of a database.
    lost_order_seq_from BIGINT,
    lost_order_seq_to BIGINT,
    fenced_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT timeline_fences_lost_range CHECK ((lost_order_seq_from IS NULL) = (lost_order_seq_to IS NULL)
                                                 AND lost_order_seq_from <= lost_order_seq_to)
);

-- A refund of a payment whose order the restore lost has no order row to hang on: a
-- PROVIDER_REFUND may be of no order (then its payload names the provider's transaction).
ALTER TABLE compensation_events DROP CONSTRAINT compensation_events_order;
ALTER TABLE compensation_events ADD CONSTRAINT compensation_events_order
    CHECK (CASE WHEN kind = 'ALERT_DELIVERY' THEN order_id IS NULL
                WHEN kind = 'PROVIDER_REFUND' THEN order_id IS NOT NULL OR payload->>'providerTxnId' IS NOT NULL
                ELSE order_id IS NOT NULL END);
