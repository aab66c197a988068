-- The core of fitorder: catalog, members with wallets, orders with their state machine,
-- check-ins, memberships, the outbox, and the audit trail.
--
-- Money is BIGINT cents. Statuses are TEXT with CHECK constraints (readable in psql, simple to
-- map); the order state machine is enforced by a trigger so that no code path and no
-- hand-written SQL can make an illegal change.

CREATE TABLE stores (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    code        TEXT NOT NULL CHECK (code ~ '^[A-Za-z0-9_-]{1,32}$'),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT stores_code_key UNIQUE (code)
);

CREATE TABLE members (
    id             BIGSERIAL PRIMARY KEY,
    store_id       BIGINT NOT NULL REFERENCES stores (id),
    name           TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    phone          TEXT NOT NULL CHECK (phone ~ '^\+?[0-9]{5,20}$'),
    -- Spendable balance and money frozen for waiting MIXED orders. Changed only by the
    -- wallet_ledger trigger below, so they always equal the sum of the ledger.
    balance_cents  BIGINT NOT NULL DEFAULT 0,
    frozen_cents   BIGINT NOT NULL DEFAULT 0,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT wallet_balance_not_negative CHECK (balance_cents >= 0),
    CONSTRAINT wallet_frozen_not_negative CHECK (frozen_cents >= 0),
    CONSTRAINT members_store_phone_key UNIQUE (store_id, phone)
);

CREATE TABLE membership_plans (
    id             BIGSERIAL PRIMARY KEY,
    store_id       BIGINT NOT NULL REFERENCES stores (id),
    name           TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    duration_days  INT NOT NULL CHECK (duration_days BETWEEN 1 AND 3660),
    price_cents    BIGINT NOT NULL CHECK (price_cents > 0),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE class_packs (
    id           BIGSERIAL PRIMARY KEY,
    store_id     BIGINT NOT NULL REFERENCES stores (id),
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    sessions     INT NOT NULL CHECK (sessions BETWEEN 1 AND 1000),
    price_cents  BIGINT NOT NULL CHECK (price_cents > 0),
    -- NULL: unlimited. Otherwise units left on sale (held by waiting and live orders).
    stock        INT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT class_pack_stock_not_negative CHECK (stock IS NULL OR stock >= 0)
);

CREATE TABLE coach_slots (
    id           BIGSERIAL PRIMARY KEY,
    store_id     BIGINT NOT NULL REFERENCES stores (id),
    coach_name   TEXT NOT NULL CHECK (length(coach_name) BETWEEN 1 AND 100),
    starts_at    TIMESTAMPTZ NOT NULL,
    ends_at      TIMESTAMPTZ NOT NULL,
    capacity     INT NOT NULL CHECK (capacity BETWEEN 1 AND 1000),
    remaining    INT NOT NULL,
    price_cents  BIGINT NOT NULL CHECK (price_cents > 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT coach_slot_ends_after_start CHECK (ends_at > starts_at),
    CONSTRAINT coach_slot_seats_in_range CHECK (remaining BETWEEN 0 AND capacity)
);

CREATE SEQUENCE order_no_seq;

CREATE TABLE orders (
    id                   BIGSERIAL PRIMARY KEY,
    -- Our out_trade_no at the providers: letters and digits only, 6..32 characters.
    order_no             TEXT NOT NULL DEFAULT ('FO' || to_char(now() AT TIME ZONE 'Asia/Shanghai', 'YYYYMMDD')
                                                  || lpad(nextval('order_no_seq')::text, 10, '0')),
    member_id            BIGINT NOT NULL REFERENCES members (id),
    store_id             BIGINT NOT NULL REFERENCES stores (id),
    kind                 TEXT NOT NULL CHECK (kind IN ('MEMBERSHIP', 'CLASS_PACK', 'PRIVATE_SESSION')),
    status               TEXT NOT NULL CHECK (status IN ('WAIT_PAY', 'PAID', 'CONSUMING', 'CONSUMED', 'CANCELED', 'REFUNDED')),
    item_name            TEXT NOT NULL,
    membership_plan_id   BIGINT REFERENCES membership_plans (id),
    class_pack_id        BIGINT REFERENCES class_packs (id),
    coach_slot_id        BIGINT REFERENCES coach_slots (id),
    plan_days            INT,
    amount_cents         BIGINT NOT NULL CHECK (amount_cents > 0),
    wallet_amount_cents  BIGINT NOT NULL DEFAULT 0,
    payment_method       TEXT NOT NULL CHECK (payment_method IN ('WECHAT_PAY', 'ALIPAY', 'WALLET', 'OFFLINE', 'MIXED')),
    online_provider      TEXT CHECK (online_provider IN ('WECHAT_PAY', 'ALIPAY')),
    sessions_total       INT NOT NULL,
    sessions_used        INT NOT NULL DEFAULT 0,
    expires_at           TIMESTAMPTZ,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    paid_at              TIMESTAMPTZ,
    canceled_at          TIMESTAMPTZ,
    cancel_reason        TEXT,
    refunded_at          TIMESTAMPTZ,
    refund_amount_cents  BIGINT,
    provider_txn_id      TEXT,
    trace_id             TEXT NOT NULL,
    idempotency_key      TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    -- sha256 of what was asked with the key: the same key with another request is a conflict.
    request_hash         TEXT NOT NULL,
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT orders_order_no_key UNIQUE (order_no),
    CONSTRAINT orders_member_idempotency_key UNIQUE (member_id, idempotency_key),
    CONSTRAINT orders_one_item CHECK (num_nonnulls(membership_plan_id, class_pack_id, coach_slot_id) = 1),
    CONSTRAINT orders_sessions_in_range CHECK (sessions_used BETWEEN 0 AND sessions_total),
    CONSTRAINT orders_wallet_part_in_range CHECK (wallet_amount_cents BETWEEN 0 AND amount_cents),
    CONSTRAINT orders_refund_in_range CHECK (refund_amount_cents IS NULL OR refund_amount_cents BETWEEN 0 AND amount_cents),
    CONSTRAINT orders_online_has_provider CHECK (
        (payment_method IN ('WECHAT_PAY', 'ALIPAY', 'MIXED')) = (online_provider IS NOT NULL))
);

-- The expiry scan reads only waiting orders, oldest deadline first: a partial index keeps it
-- small however many orders the chain has.
CREATE INDEX orders_waiting_by_expiry ON orders (expires_at) WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL;
CREATE INDEX orders_member_newest ON orders (member_id, id DESC);
CREATE INDEX orders_store_newest ON orders (store_id, id DESC);
CREATE INDEX orders_status_newest ON orders (status, id DESC);
CREATE INDEX orders_coach_slot ON orders (coach_slot_id) WHERE coach_slot_id IS NOT NULL;
CREATE INDEX orders_class_pack ON orders (class_pack_id) WHERE class_pack_id IS NOT NULL;

-- The state machine, as the database sees it. The same table lives in src/domain/order_status.rs;
-- a test keeps both in step. Orders are born WAIT_PAY (a wallet order is paid in the same
-- transaction it is placed in, through the WAIT_PAY -> PAID step like every other).
CREATE FUNCTION order_status_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'WAIT_PAY' THEN
            RAISE EXCEPTION 'illegal order transition: NONE -> %', NEW.status
                USING ERRCODE = 'FS001', DETAIL = 'from=NONE to=' || NEW.status;
        END IF;
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        IF (OLD.status, NEW.status) NOT IN (
            ('WAIT_PAY', 'PAID'), ('WAIT_PAY', 'CANCELED'),
            ('PAID', 'CONSUMING'), ('PAID', 'REFUNDED'),
            ('CONSUMING', 'CONSUMED'), ('CONSUMING', 'REFUNDED')) THEN
            RAISE EXCEPTION 'illegal order transition: % -> %', OLD.status, NEW.status
                USING ERRCODE = 'FS001', DETAIL = 'from=' || OLD.status || ' to=' || NEW.status;
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER orders_status_guard BEFORE INSERT OR UPDATE OF status ON orders
    FOR EACH ROW EXECUTE FUNCTION order_status_guard();

-- Who moved an order, from what to what, why, and under which trace id.
CREATE TABLE order_transitions (
    id           BIGSERIAL PRIMARY KEY,
    order_id     BIGINT NOT NULL REFERENCES orders (id),
    from_status  TEXT,
    to_status    TEXT NOT NULL,
    actor        TEXT NOT NULL,
    reason       TEXT NOT NULL,
    trace_id     TEXT NOT NULL,
    at           TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX order_transitions_by_order ON order_transitions (order_id, id);
CREATE INDEX order_transitions_by_time ON order_transitions (at);

-- Every movement of wallet money is a row here; the trigger applies it to the member's
-- balance and frozen amount, whose CHECK constraints refuse anything that would go negative.
CREATE TABLE wallet_ledger (
    id             BIGSERIAL PRIMARY KEY,
    member_id      BIGINT NOT NULL REFERENCES members (id),
    kind           TEXT NOT NULL CHECK (kind IN ('TOP_UP', 'PAY', 'FREEZE', 'UNFREEZE', 'CAPTURE', 'REFUND')),
    balance_delta  BIGINT NOT NULL,
    frozen_delta   BIGINT NOT NULL,
    order_id       BIGINT REFERENCES orders (id),
    reference      TEXT,
    actor          TEXT NOT NULL,
    trace_id       TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX wallet_ledger_by_member ON wallet_ledger (member_id, id);
CREATE UNIQUE INDEX wallet_ledger_top_up_reference ON wallet_ledger (member_id, reference) WHERE kind = 'TOP_UP';
-- At most one of each money movement per order: a bug that tries to pay or refund twice fails.
CREATE UNIQUE INDEX wallet_ledger_once_per_order ON wallet_ledger (order_id, kind) WHERE order_id IS NOT NULL;

CREATE FUNCTION wallet_ledger_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE members
       SET balance_cents = balance_cents + NEW.balance_delta,
           frozen_cents = frozen_cents + NEW.frozen_delta
     WHERE id = NEW.member_id;
    RETURN NEW;
END $$;

CREATE TRIGGER wallet_ledger_apply AFTER INSERT ON wallet_ledger
    FOR EACH ROW EXECUTE FUNCTION wallet_ledger_apply();

-- Applied payments: one per order, ever. The idempotency key is the provider's
-- out_trade_no:transaction_id (or wallet:/offline: keys for money taken here).
CREATE TABLE payments (
    id               BIGSERIAL PRIMARY KEY,
    order_id         BIGINT NOT NULL REFERENCES orders (id),
    method           TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    provider_txn_id  TEXT,
    amount_cents     BIGINT NOT NULL,
    wallet_cents     BIGINT NOT NULL,
    online_cents     BIGINT NOT NULL,
    reference        TEXT,
    actor            TEXT NOT NULL,
    trace_id         TEXT NOT NULL,
    paid_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT payments_one_per_order UNIQUE (order_id),
    CONSTRAINT payments_idempotency_key UNIQUE (idempotency_key)
);

CREATE TABLE refunds (
    id            BIGSERIAL PRIMARY KEY,
    order_id      BIGINT NOT NULL REFERENCES orders (id),
    amount_cents  BIGINT NOT NULL CHECK (amount_cents >= 0),
    wallet_cents  BIGINT NOT NULL CHECK (wallet_cents >= 0),
    online_cents  BIGINT NOT NULL CHECK (online_cents >= 0),
    reason        TEXT NOT NULL,
    actor         TEXT NOT NULL,
    trace_id      TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT refunds_one_per_order UNIQUE (order_id)
);

CREATE TABLE memberships (
    id          BIGSERIAL PRIMARY KEY,
    member_id   BIGINT NOT NULL REFERENCES members (id),
    store_id    BIGINT NOT NULL REFERENCES stores (id),
    plan_id     BIGINT NOT NULL REFERENCES membership_plans (id),
    order_id    BIGINT NOT NULL REFERENCES orders (id),
    status      TEXT NOT NULL CHECK (status IN ('ACTIVE', 'EXPIRED', 'REVOKED')),
    valid_from  TIMESTAMPTZ NOT NULL,
    valid_to    TIMESTAMPTZ NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at    TIMESTAMPTZ,
    CONSTRAINT memberships_one_per_order UNIQUE (order_id),
    CONSTRAINT memberships_valid_range CHECK (valid_to > valid_from)
);
CREATE INDEX memberships_by_member ON memberships (member_id, id DESC);
CREATE INDEX memberships_active_by_end ON memberships (valid_to) WHERE status = 'ACTIVE';

-- Check-ins, keyed by the venue's consumption serial number within an order.
CREATE TABLE check_ins (
    id               BIGSERIAL PRIMARY KEY,
    order_id         BIGINT NOT NULL REFERENCES orders (id),
    consume_txn_no   TEXT NOT NULL CHECK (length(consume_txn_no) BETWEEN 1 AND 64),
    sessions         INT NOT NULL CHECK (sessions >= 0),
    remaining_after  INT NOT NULL,
    actor            TEXT NOT NULL,
    trace_id         TEXT NOT NULL,
    at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT check_ins_order_txn_key UNIQUE (order_id, consume_txn_no)
);

-- The transactional outbox ("local message table"): written in the transaction of the status
-- change that causes it, delivered by the compensation worker.
CREATE TABLE compensation_events (
    id               BIGSERIAL PRIMARY KEY,
    order_id         BIGINT NOT NULL REFERENCES orders (id),
    kind             TEXT NOT NULL CHECK (kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT',
                                                   'AI_ACCESS_REVOKE', 'PROVIDER_REFUND')),
    status           TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    attempts         INT NOT NULL DEFAULT 0,
    max_attempts     INT NOT NULL,
    next_attempt_at  TIMESTAMPTZ DEFAULT now(),
    last_error       TEXT,
    payload          JSONB NOT NULL,
    idempotency_key  TEXT NOT NULL,
    trace_id         TEXT NOT NULL,
    -- A worker holds a claimed row until this time; a worker that dies lets the lease run out.
    locked_until     TIMESTAMPTZ,
    locked_by        TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT compensation_idempotency_key UNIQUE (idempotency_key)
);
CREATE INDEX compensation_due ON compensation_events (next_attempt_at) WHERE status IN ('PENDING', 'RETRYING');
CREATE INDEX compensation_by_order ON compensation_events (order_id, id);
CREATE INDEX compensation_by_status ON compensation_events (status, id DESC);

CREATE TABLE compensation_attempts (
    id           BIGSERIAL PRIMARY KEY,
    event_id     BIGINT NOT NULL REFERENCES compensation_events (id),
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    ok           BOOLEAN NOT NULL,
    error        TEXT,
    duration_ms  INT NOT NULL,
    worker       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX compensation_attempts_by_event ON compensation_attempts (event_id, id);

-- Things worth counting that leave no other row behind (a duplicate check-in, a refused
-- transition): anomalyStats reads them together with the callbacks and tickets.
CREATE TABLE anomaly_events (
    id         BIGSERIAL PRIMARY KEY,
    category   TEXT NOT NULL,
    order_id   BIGINT REFERENCES orders (id),
    store_id   BIGINT REFERENCES stores (id),
    detail     TEXT NOT NULL,
    trace_id   TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX anomaly_events_by_time ON anomaly_events (at);
