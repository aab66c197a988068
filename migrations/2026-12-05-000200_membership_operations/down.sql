ALTER TABLE wallet_ledger DROP CONSTRAINT wallet_ledger_kind_check;
ALTER TABLE wallet_ledger ADD CONSTRAINT wallet_ledger_kind_check
    CHECK (kind IN ('TOP_UP', 'PAY', 'FREEZE', 'UNFREEZE', 'CAPTURE', 'REFUND'));
DROP TABLE membership_events;
DROP TABLE membership_freezes;
DROP TRIGGER memberships_status_guard ON memberships;
DROP FUNCTION membership_status_guard();
ALTER TABLE membership_plans DROP COLUMN max_freezes, DROP COLUMN max_freeze_days;
DROP INDEX memberships_frozen;
ALTER TABLE memberships DROP COLUMN transferred_at, DROP COLUMN frozen_days;
ALTER TABLE memberships DROP CONSTRAINT memberships_status_check;
ALTER TABLE memberships ADD CONSTRAINT memberships_status_check CHECK (status IN ('ACTIVE', 'EXPIRED', 'REVOKED'));
