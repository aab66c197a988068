DROP VIEW alert_attempts;
DROP VIEW alert_deliveries;
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
-- The outbox's alert rows back into the tables (their ids kept).
INSERT INTO alert_deliveries (id, alert_id, channel, status, attempts, max_attempts, next_attempt_at, last_error,
                              locked_until, locked_by, delivered_at, created_at, updated_at)
SELECT e.id, (e.payload->>'alertId')::bigint, e.payload->>'channel', e.status, e.attempts, e.max_attempts,
       e.next_attempt_at, e.last_error, NULL, NULL, CASE WHEN e.status = 'SUCCEEDED' THEN e.updated_at END,
       e.created_at, e.updated_at
  FROM compensation_events e WHERE e.kind = 'ALERT_DELIVERY';
INSERT INTO alert_attempts (delivery_id, channel, at, ok, error, duration_ms, worker)
SELECT a.event_id, e.payload->>'channel', a.at, a.ok, a.error, a.duration_ms, a.worker
  FROM compensation_attempts a JOIN compensation_events e ON e.id = a.event_id WHERE e.kind = 'ALERT_DELIVERY';
SELECT setval('alert_deliveries_id_seq', GREATEST((SELECT max(id) FROM alert_deliveries), 1));
