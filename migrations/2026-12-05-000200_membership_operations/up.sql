-- Membership operations (README "Membership operations (停卡, 转卡)"): freezing and
-- transferring cards, with their own state machine and history.

-- The card's statuses: FROZEN joins them; the pairs are held by the trigger below, as orders'.
ALTER TABLE memberships DROP CONSTRAINT memberships_status_check;
ALTER TABLE memberships ADD CONSTRAINT memberships_status_check
    CHECK (status IN ('ACTIVE', 'FROZEN', 'EXPIRED', 'REVOKED'));
-- frozen_days: the days the card was frozen (a running freeze's whole), which `valid_to`
-- was moved by; transferred_at: the card passed to another member (its order no longer
-- refundable).
ALTER TABLE memberships
    ADD COLUMN frozen_days INT NOT NULL DEFAULT 0 CONSTRAINT memberships_frozen_days_not_negative CHECK (frozen_days >= 0),
    ADD COLUMN transferred_at TIMESTAMPTZ;
CREATE INDEX memberships_frozen ON memberships (id) WHERE status = 'FROZEN';

ALTER TABLE membership_plans
    ADD COLUMN max_freeze_days INT NOT NULL DEFAULT 30
        CONSTRAINT membership_plans_max_freeze_days_in_range CHECK (max_freeze_days BETWEEN 0 AND 3660),
    ADD COLUMN max_freezes INT NOT NULL DEFAULT 3
        CONSTRAINT membership_plans_max_freezes_in_range CHECK (max_freezes BETWEEN 0 AND 100);

-- Membership status pairs (crates/domain/src/membership.rs, TRANSITIONS); a test keeps both in
-- step. Cards are born ACTIVE (their order paid).
CREATE FUNCTION membership_status_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'ACTIVE' THEN
            RAISE EXCEPTION 'illegal membership transition: NONE -> %', NEW.status
                USING ERRCODE = 'FS002', DETAIL = 'from=NONE to=' || NEW.status;
        END IF;
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        IF (OLD.status, NEW.status) NOT IN (
            ('ACTIVE', 'FROZEN'), ('FROZEN', 'ACTIVE'), ('ACTIVE', 'EXPIRED'),
            ('ACTIVE', 'REVOKED'), ('FROZEN', 'REVOKED')) THEN
            RAISE EXCEPTION 'illegal membership transition: % -> %', OLD.status, NEW.status
                USING ERRCODE = 'FS002', DETAIL = 'from=' || OLD.status || ' to=' || NEW.status;
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER memberships_status_guard BEFORE INSERT OR UPDATE OF status ON memberships
    FOR EACH ROW EXECUTE FUNCTION membership_status_guard();

-- One freeze of a card: its days [from_date, until_date) in the business time zone, and the
-- instants they start and end (starts_at, ends_at), which the scheduler acts on. until_date is
-- brought forward when the freeze ends early (a started day counts), to from_date when it is
-- called off before it started.
CREATE TABLE membership_freezes (
    id             BIGSERIAL PRIMARY KEY,
    membership_id  BIGINT NOT NULL REFERENCES memberships (id),
    state          TEXT NOT NULL DEFAULT 'SCHEDULED'
                   CHECK (state IN ('SCHEDULED', 'RUNNING', 'DONE', 'CALLED_OFF')),
    from_date      DATE NOT NULL,
    until_date     DATE NOT NULL,
    starts_at      TIMESTAMPTZ NOT NULL,
    ends_at        TIMESTAMPTZ NOT NULL,
    ended_at       TIMESTAMPTZ,
    reason         TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    actor          TEXT NOT NULL,
    trace_id       TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT membership_freezes_span CHECK (until_date >= from_date AND ends_at >= starts_at)
);
CREATE INDEX membership_freezes_by_card ON membership_freezes (membership_id, from_date);
CREATE INDEX membership_freezes_due_start ON membership_freezes (starts_at) WHERE state = 'SCHEDULED';
CREATE INDEX membership_freezes_due_end ON membership_freezes (ends_at) WHERE state = 'RUNNING';

-- A card's history: every start, freeze, unfreeze, transfer, expiry and revocation, with who,
-- why and the trace id, written in the statement of the change
-- (crates/capabilities/src/memberships/change.sql).
CREATE TABLE membership_events (
    id              BIGSERIAL PRIMARY KEY,
    membership_id   BIGINT NOT NULL REFERENCES memberships (id),
    kind            TEXT NOT NULL
                    CHECK (kind IN ('STARTED', 'FROZEN', 'UNFROZEN', 'TRANSFERRED', 'EXPIRED', 'REVOKED')),
    from_status     TEXT,
    to_status       TEXT NOT NULL,
    actor           TEXT NOT NULL,
    reason          TEXT,
    summary         TEXT NOT NULL,
    trace_id        TEXT NOT NULL,
    from_member_id  BIGINT REFERENCES members (id),
    to_member_id    BIGINT REFERENCES members (id),
    at              TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX membership_events_by_card ON membership_events (membership_id, id);

-- Every card so far started: its STARTED row, so that each card's history begins.
INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, summary, trace_id, to_member_id, at)
SELECT m.id, 'STARTED', NULL, 'ACTIVE', 'system:migration', 'started (recorded when history began)',
       coalesce(o.trace_id, 'migration'), m.member_id, m.created_at
  FROM memberships m JOIN orders o ON o.id = m.order_id;

-- A transfer's fee comes out of the old holder's wallet: a movement of its own.
ALTER TABLE wallet_ledger DROP CONSTRAINT wallet_ledger_kind_check;
ALTER TABLE wallet_ledger ADD CONSTRAINT wallet_ledger_kind_check
    CHECK (kind IN ('TOP_UP', 'PAY', 'FREEZE', 'UNFREEZE', 'CAPTURE', 'REFUND', 'FEE'));

-- What a member holds with an operator: a card's days frozen through today are not used.
CREATE OR REPLACE FUNCTION prepaid_holdings(p_member bigint, p_operator text, p_today date, p_tz text)
RETURNS TABLE (membership_cents bigint, membership_days bigint, sessions_cents bigint,
               sessions_count bigint, wallet_cents bigint, total_cents bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    WITH held AS (
        SELECT o.kind,
               o.status,
               o.wallet_amount_cents,
               CASE WHEN o.kind = 'MEMBERSHIP' THEN
                        CASE WHEN o.status = 'WAIT_PAY' OR m.valid_from IS NULL THEN o.plan_days
                             ELSE greatest(0, o.plan_days
                                  - least(o.plan_days, greatest(0, p_today - (m.valid_from AT TIME ZONE p_tz)::date + 1
                                          - coalesce((SELECT sum(greatest(0, least(f.until_date, p_today + 1) - f.from_date))
                                                        FROM membership_freezes f
                                                       WHERE f.membership_id = m.id
                                                         AND f.state IN ('RUNNING', 'DONE')), 0))))
                        END
                    ELSE o.sessions_total - o.sessions_used
               END AS unused,
               CASE WHEN o.kind = 'MEMBERSHIP' THEN o.plan_days ELSE o.sessions_total END AS whole,
               o.amount_cents
          FROM orders o
          JOIN stores s ON s.id = o.store_id AND s.operator_code = p_operator
          LEFT JOIN memberships m ON m.order_id = o.id
         WHERE o.member_id = p_member
           AND o.status IN ('WAIT_PAY', 'PAID', 'CONSUMING')
           AND (o.kind = 'MEMBERSHIP' OR (o.kind = 'CLASS_PACK' AND o.sessions_total > 1))
    ), valued AS (
        SELECT kind, unused,
               (amount_cents * unused / greatest(whole, 1))::bigint AS value,
               (amount_cents * unused / greatest(whole, 1))::bigint
                 - CASE WHEN status = 'WAIT_PAY' THEN wallet_amount_cents ELSE 0 END AS in_total
          FROM held
    ), wallet AS (
        SELECT coalesce(sum(mb.balance_cents + mb.frozen_cents), 0)::bigint AS cents
          FROM members mb JOIN stores s ON s.id = mb.store_id AND s.operator_code = p_operator
         WHERE mb.id = p_member
    )
    SELECT coalesce(sum(value) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_cents,
           coalesce(sum(unused) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_days,
           coalesce(sum(value) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_cents,
           coalesce(sum(unused) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_count,
           (SELECT cents FROM wallet) AS wallet_cents,
           (coalesce(sum(in_total), 0) + (SELECT cents FROM wallet))::bigint AS total_cents
      FROM valued
$$;
