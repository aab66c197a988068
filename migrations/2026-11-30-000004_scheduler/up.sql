-- Periodic tasks: a row per task and tick. The unique key is the cluster-wide lock: whichever
-- instance inserts the row runs the tick, every other instance finds it taken.
CREATE TABLE task_runs (
    id            BIGSERIAL PRIMARY KEY,
    task          TEXT NOT NULL,
    tick          TIMESTAMPTZ NOT NULL,
    status        TEXT NOT NULL DEFAULT 'RUNNING' CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    instance      TEXT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at   TIMESTAMPTZ,
    rows_touched  BIGINT NOT NULL DEFAULT 0,
    detail        TEXT,
    CONSTRAINT task_runs_once_per_tick UNIQUE (task, tick)
);
CREATE INDEX task_runs_newest ON task_runs (id DESC);
CREATE INDEX task_runs_running ON task_runs (started_at) WHERE status = 'RUNNING';
