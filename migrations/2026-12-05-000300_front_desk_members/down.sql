DROP TABLE catalog_changes;
ALTER TABLE class_packs DROP COLUMN retired_at;
ALTER TABLE membership_plans DROP COLUMN retired_at;
DROP INDEX members_name_trgm;
DROP INDEX members_phone_last4;
-- pg_trgm stays: other databases' objects may use it, and dropping it is not this migration's.
