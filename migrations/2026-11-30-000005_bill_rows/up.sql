-- Staging for a bill being reconciled: loaded with COPY, joined against the books in SQL,
-- emptied when the run ends. Unlogged: it is rebuilt from the bill file whenever needed.
CREATE UNLOGGED TABLE bill_rows (
    run_id              BIGINT NOT NULL,
    line                INT NOT NULL,
    kind                TEXT NOT NULL,
    out_trade_no        TEXT NOT NULL,
    provider_txn_id     TEXT NOT NULL,
    amount_cents        BIGINT NOT NULL,
    refund_no           TEXT,
    provider_refund_id  TEXT
);
CREATE INDEX bill_rows_by_run_txn ON bill_rows (run_id, provider_txn_id);
CREATE INDEX bill_rows_by_run_refund ON bill_rows (run_id, refund_no);
CREATE INDEX payments_by_txn ON payments (provider_txn_id);
CREATE INDEX payments_by_paid_at ON payments (paid_at);
