-- Evidence and follow-up: every payment callback as received, the exception tickets staff
-- work through, and the reconciliation runs against the providers' bills.

CREATE TABLE payment_callbacks (
    id               BIGSERIAL PRIMARY KEY,
    provider         TEXT NOT NULL CHECK (provider IN ('WECHAT_PAY', 'ALIPAY')),
    received_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    verified         BOOLEAN NOT NULL,
    -- APPLIED, DUPLICATE, REJECTED_TRANSITION, PAID_AFTER_CANCEL, AMOUNT_MISMATCH, BAD_SIGNATURE,
    -- UNKNOWN_ORDER, RECORDED (a notification with nothing to apply), RECEIVED (not yet decided).
    outcome          TEXT NOT NULL,
    event_type       TEXT,
    body             TEXT NOT NULL,
    headers          JSONB NOT NULL DEFAULT '{}',
    order_id         BIGINT REFERENCES orders (id),
    order_no         TEXT,
    store_id         BIGINT REFERENCES stores (id),
    idempotency_key  TEXT,
    provider_txn_id  TEXT,
    amount_cents     BIGINT,
    error            TEXT,
    trace_id         TEXT NOT NULL
);
CREATE INDEX payment_callbacks_by_order ON payment_callbacks (order_id, id);
CREATE INDEX payment_callbacks_by_order_no ON payment_callbacks (order_no, id);
CREATE INDEX payment_callbacks_by_time ON payment_callbacks (received_at);
CREATE INDEX payment_callbacks_by_key ON payment_callbacks (idempotency_key);

CREATE TABLE exception_tickets (
    id                     BIGSERIAL PRIMARY KEY,
    kind                   TEXT NOT NULL CHECK (kind IN ('PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING',
                                        'AMOUNT_MISMATCH', 'REFUND_MISMATCH', 'PAID_AFTER_CANCEL', 'COMPENSATION_DEAD',
                                        'UNKNOWN_ORDER', 'REJECTED_TRANSITION')),
    status                 TEXT NOT NULL DEFAULT 'OPEN' CHECK (status IN ('OPEN', 'IN_PROGRESS', 'RESOLVED', 'DISMISSED')),
    provider               TEXT CHECK (provider IN ('WECHAT_PAY', 'ALIPAY')),
    order_id               BIGINT REFERENCES orders (id),
    order_no               TEXT,
    store_id               BIGINT REFERENCES stores (id),
    provider_txn_id        TEXT,
    local_amount_cents     BIGINT,
    provider_amount_cents  BIGINT,
    detail                 JSONB NOT NULL,
    -- What makes a finding the same finding: re-running a day or receiving the same callback
    -- again never opens a second ticket.
    finding_key            TEXT NOT NULL,
    opened_at              TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at            TIMESTAMPTZ,
    resolution             TEXT CHECK (resolution IN ('REFUND', 'CREDIT_SESSIONS', 'REPLAY_COMPENSATION', 'MARK_PAID', 'NO_ACTION')),
    resolved_by            TEXT,
    note                   TEXT,
    trace_id               TEXT NOT NULL,
    CONSTRAINT exception_tickets_finding_key UNIQUE (finding_key)
);
CREATE INDEX exception_tickets_by_order ON exception_tickets (order_id, id);
CREATE INDEX exception_tickets_by_status ON exception_tickets (status, id DESC);
CREATE INDEX exception_tickets_by_time ON exception_tickets (opened_at);

CREATE TABLE reconciliation_runs (
    id              BIGSERIAL PRIMARY KEY,
    provider        TEXT NOT NULL CHECK (provider IN ('WECHAT_PAY', 'ALIPAY')),
    bill_date       DATE NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    started_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at     TIMESTAMPTZ,
    provider_rows   INT NOT NULL DEFAULT 0,
    local_rows      INT NOT NULL DEFAULT 0,
    matched         INT NOT NULL DEFAULT 0,
    tickets_opened  INT NOT NULL DEFAULT 0,
    error           TEXT,
    trace_id        TEXT NOT NULL
);
-- Runs of the same provider and day never overlap.
CREATE UNIQUE INDEX reconciliation_one_running ON reconciliation_runs (provider, bill_date) WHERE status = 'RUNNING';
CREATE INDEX reconciliation_runs_newest ON reconciliation_runs (id DESC);

-- Idempotency keys of payment and refund notifications (`out_trade_no:transaction_id`): the
-- primary key decides who applies a payment, not a read-then-write.
CREATE TABLE payment_keys (
    key          TEXT PRIMARY KEY,
    callback_id  BIGINT NOT NULL REFERENCES payment_callbacks (id),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
