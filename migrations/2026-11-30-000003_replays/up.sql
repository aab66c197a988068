-- Who sent a DEAD event back to the queue, and when.
CREATE TABLE compensation_replays (
    id        BIGSERIAL PRIMARY KEY,
    event_id  BIGINT NOT NULL REFERENCES compensation_events (id),
    actor     TEXT NOT NULL,
    trace_id  TEXT NOT NULL,
    at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX compensation_replays_by_event ON compensation_replays (event_id, id);
