-- Prepaid money (预付款, README "Prepaid money"): the business operator of each store, the rules
-- a store sells under, the business calendar, and what an order keeps of them.

-- The operator's 统一社会信用代码: prepaid caps count per member and operator. By default the
-- store's own code (a store is its own operator until staff say otherwise).
ALTER TABLE stores ADD COLUMN operator_code TEXT;
UPDATE stores SET operator_code = code;
ALTER TABLE stores ALTER COLUMN operator_code SET NOT NULL,
    ADD CONSTRAINT stores_operator_code_shape CHECK (operator_code ~ '^[A-Za-z0-9_-]{1,32}$');
CREATE INDEX stores_by_operator ON stores (operator_code);

-- The rules a store sells under, resolved (the preset's values with the overrides); no row is
-- the NONE preset. Written by `prepaid::set_rules` only.
CREATE TABLE prepaid_rules (
    store_id                    BIGINT PRIMARY KEY REFERENCES stores (id),
    preset                      TEXT NOT NULL CHECK (preset IN ('NONE', 'SHANGHAI_2025', 'BEIJING', 'CUSTOM')),
    membership_max_cents        BIGINT CHECK (membership_max_cents BETWEEN 1 AND 100000000),
    membership_max_days         INT CHECK (membership_max_days BETWEEN 1 AND 3660),
    sessions_max_cents          BIGINT CHECK (sessions_max_cents BETWEEN 1 AND 100000000),
    sessions_max_count          INT CHECK (sessions_max_count BETWEEN 1 AND 1000),
    top_up_max_cents            BIGINT CHECK (top_up_max_cents BETWEEN 1 AND 100000000),
    total_max_cents             BIGINT CHECK (total_max_cents BETWEEN 1 AND 100000000),
    cooling_off_days            INT NOT NULL CHECK (cooling_off_days BETWEEN 0 AND 30),
    refund_within_working_days  INT NOT NULL CHECK (refund_within_working_days BETWEEN 1 AND 60),
    terms_version               TEXT CHECK (char_length(terms_version) BETWEEN 1 AND 32),
    terms_text                  TEXT CHECK (char_length(terms_text) BETWEEN 1 AND 20000),
    set_by                      TEXT NOT NULL,
    trace_id                    TEXT NOT NULL,
    set_at                      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT prepaid_rules_terms_together CHECK ((terms_version IS NULL) = (terms_text IS NULL))
);

-- The business calendar: dates staff set (public holidays, 调休 weekend days worked); any other
-- date is a working day Monday to Friday.
CREATE TABLE business_days (
    day       DATE PRIMARY KEY CHECK (day BETWEEN DATE '2000-01-01' AND DATE '2100-12-31'),
    working   BOOLEAN NOT NULL,
    note      TEXT CHECK (char_length(note) <= 200),
    set_by    TEXT NOT NULL,
    trace_id  TEXT NOT NULL,
    set_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- What a prepaid order keeps of the rules it was sold under (rules change; a sale does not):
-- the terms the member accepted, the cooling-off days and the refund deadline's working days;
-- and, once a cooling-off refund is asked for, the date it must have reached the payer. A row
-- only for prepaid orders of a store with cooling-off or terms; written by `orders` only.
CREATE TABLE order_prepaid (
    order_id                    BIGINT PRIMARY KEY REFERENCES orders (id),
    accepted_terms_version      TEXT,
    cooling_off_days            INT NOT NULL CHECK (cooling_off_days BETWEEN 0 AND 30),
    refund_within_working_days  INT NOT NULL CHECK (refund_within_working_days BETWEEN 1 AND 60),
    refund_due_by               DATE
);
-- The overdue sweep looks only at cooling-off refunds with a deadline.
CREATE INDEX order_prepaid_refund_due ON order_prepaid (refund_due_by) WHERE refund_due_by IS NOT NULL;

ALTER TABLE exception_tickets DROP CONSTRAINT exception_tickets_kind_check;
ALTER TABLE exception_tickets ADD CONSTRAINT exception_tickets_kind_check CHECK (kind IN (
    'PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'AMOUNT_MISMATCH', 'REFUND_MISMATCH',
    'PAID_AFTER_CANCEL', 'COMPENSATION_DEAD', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'REFUND_OVERDUE'));

-- The ledger reads a store's prepaid orders by payment time (`prepaid/ledger.sql`), and the
-- check-ins and refunds of a stretch of days.
CREATE INDEX orders_prepaid_by_store ON orders (store_id, paid_at)
    WHERE paid_at IS NOT NULL AND (kind = 'MEMBERSHIP' OR (kind = 'CLASS_PACK' AND sessions_total > 1));
CREATE INDEX IF NOT EXISTS check_ins_by_time ON check_ins (at);
CREATE INDEX IF NOT EXISTS refunds_by_time ON refunds (created_at);

-- The ledger's closed days: a day's figures once it is over (the `prepaid:close` task, each night
-- for the days before), so that a range reads them instead of recomputing from every order.
-- Written by `prepaid::ledger` only; a day is closed once (its first computation stands).
CREATE TABLE prepaid_ledger_days (
    store_id        BIGINT NOT NULL REFERENCES stores (id),
    day             DATE NOT NULL,
    collected_cents BIGINT NOT NULL,
    refunded_cents  BIGINT NOT NULL,
    balance_cents   BIGINT NOT NULL,
    -- What the cards held at the end of the day earn the next day: the days after it need not
    -- read every card running through them.
    card_rate_cents BIGINT NOT NULL,
    closed_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, day)
);
-- Cards that start or end in a stretch of dates, by store (the ledger after a closed day).
CREATE INDEX memberships_by_store_end ON memberships (store_id, valid_to);
CREATE INDEX memberships_by_store_start ON memberships (store_id, valid_from);
