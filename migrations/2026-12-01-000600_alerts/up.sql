-- Alerts: what must reach people (a DEAD event, a paid-after-cancel order, a failed
-- reconciliation...). An alert is written in the transaction of what caused it, once per cause
-- (`dedupe_key`); the outbox workers fan it out to every configured chat channel and deliver
-- each copy with retries, DEAD and replay like any other effect.
CREATE TABLE alerts (
    id             BIGSERIAL PRIMARY KEY,
    cause          TEXT NOT NULL,
    dedupe_key     TEXT NOT NULL,
    title          TEXT NOT NULL,
    -- The message lines (Chinese), without the trace id and the ops link (added per channel).
    lines          JSONB NOT NULL,
    order_no       TEXT,
    trace_id       TEXT NOT NULL,
    detail         JSONB NOT NULL DEFAULT '{}',
    -- Set when the workers made one delivery row per configured channel.
    fanned_out_at  TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT alerts_dedupe_key UNIQUE (dedupe_key)
);
CREATE INDEX alerts_to_fan_out ON alerts (id) WHERE fanned_out_at IS NULL;

-- One copy of an alert for one channel (a channel is named by its kind and a hash of its URL:
-- the URL's token and the signing secret are never stored).
CREATE TABLE alert_deliveries (
    id               BIGSERIAL PRIMARY KEY,
    alert_id         BIGINT NOT NULL REFERENCES alerts (id),
    channel          TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    attempts         INT NOT NULL DEFAULT 0,
    max_attempts     INT NOT NULL,
    next_attempt_at  TIMESTAMPTZ DEFAULT now(),
    last_error       TEXT,
    locked_until     TIMESTAMPTZ,
    locked_by        TEXT,
    delivered_at     TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT alert_deliveries_once UNIQUE (alert_id, channel)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_at) WHERE status IN ('PENDING', 'RETRYING');
CREATE INDEX alert_deliveries_by_status ON alert_deliveries (status, id DESC);

-- Every request made to a channel: the attempt log, and what the per-channel rate limit counts.
CREATE TABLE alert_attempts (
    id           BIGSERIAL PRIMARY KEY,
    delivery_id  BIGINT NOT NULL REFERENCES alert_deliveries (id),
    channel      TEXT NOT NULL,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    ok           BOOLEAN NOT NULL,
    error        TEXT,
    duration_ms  INT NOT NULL,
    worker       TEXT NOT NULL
);
CREATE INDEX alert_attempts_by_channel ON alert_attempts (channel, at);
CREATE INDEX alert_attempts_by_delivery ON alert_attempts (delivery_id, id);
