-- The front desk's everyday (issue 39): finding members, and the catalog changing.

-- Finding a member among a million: by the last four digits of the phone (the whole number is
-- looked up through the same index, its last four first, then the whole), and by any part of
-- the name (trigrams, case-insensitive for Latin letters; Chinese characters are word
-- characters under the database's UTF-8 ctype, so a part of three or more characters is served
-- by the index; shorter parts are checked row by row).
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX members_phone_last4 ON members (right(phone, 4));
CREATE INDEX members_name_trgm ON members USING gin (name gin_trgm_ops);

-- A retired catalog item is sold no more; the orders that bought it keep it.
ALTER TABLE membership_plans ADD COLUMN retired_at TIMESTAMPTZ;
ALTER TABLE class_packs ADD COLUMN retired_at TIMESTAMPTZ;

-- Who changed a catalog item, when, why (the trace) and what: one row per update or
-- retirement, written in the change's transaction by `catalog` only.
CREATE TABLE catalog_changes (
    id                  BIGSERIAL PRIMARY KEY,
    store_id            BIGINT NOT NULL REFERENCES stores (id),
    membership_plan_id  BIGINT REFERENCES membership_plans (id),
    class_pack_id       BIGINT REFERENCES class_packs (id),
    retired             BOOLEAN NOT NULL,
    summary             TEXT NOT NULL,
    actor               TEXT NOT NULL,
    trace_id            TEXT NOT NULL,
    at                  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT catalog_changes_one_item CHECK (num_nonnulls(membership_plan_id, class_pack_id) = 1)
);
CREATE INDEX catalog_changes_by_plan ON catalog_changes (membership_plan_id, id) WHERE membership_plan_id IS NOT NULL;
CREATE INDEX catalog_changes_by_pack ON catalog_changes (class_pack_id, id) WHERE class_pack_id IS NOT NULL;
