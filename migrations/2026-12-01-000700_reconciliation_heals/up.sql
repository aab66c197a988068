-- What a reconciliation run settled by itself instead of opening a ticket: the share of
-- findings that needed no person (`reconciliationHealing`).
CREATE TABLE reconciliation_heals (
    id BIGSERIAL PRIMARY KEY,
    run_id BIGINT NOT NULL REFERENCES reconciliation_runs (id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    bill_date DATE NOT NULL,
    -- The ticket kind it would have been: PROVIDER_PAID_LOCAL_UNPAID, LOCAL_PAID_PROVIDER_MISSING.
    category TEXT NOT NULL,
    -- SETTLED (applied as its callback), REFUNDED_PAID_AFTER_CANCEL, CONFIRMED_BY_QUERY.
    action TEXT NOT NULL,
    order_no TEXT NOT NULL,
    provider_txn_id TEXT,
    trace_id TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX reconciliation_heals_created ON reconciliation_heals (created_at);
CREATE INDEX reconciliation_heals_run ON reconciliation_heals (run_id);

-- WAITING: the provider has not made the day's bill yet; asked again until 18:00.
ALTER TABLE reconciliation_runs DROP CONSTRAINT reconciliation_runs_status_check;
ALTER TABLE reconciliation_runs ADD CONSTRAINT reconciliation_runs_status_check
    CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'WAITING'));
