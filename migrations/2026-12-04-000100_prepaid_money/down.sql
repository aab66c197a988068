DROP INDEX IF EXISTS memberships_by_store_start;
DROP INDEX IF EXISTS memberships_by_store_end;
DROP TABLE IF EXISTS prepaid_ledger_days;
DROP INDEX IF EXISTS refunds_by_time;
DROP INDEX IF EXISTS check_ins_by_time;
DROP INDEX IF EXISTS orders_prepaid_by_store;
ALTER TABLE exception_tickets DROP CONSTRAINT exception_tickets_kind_check;
ALTER TABLE exception_tickets ADD CONSTRAINT exception_tickets_kind_check CHECK (kind IN (
    'PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'AMOUNT_MISMATCH', 'REFUND_MISMATCH',
    'PAID_AFTER_CANCEL', 'COMPENSATION_DEAD', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION'));
DROP TABLE order_prepaid;
DROP TABLE business_days;
DROP TABLE prepaid_rules;
DROP INDEX stores_by_operator;
ALTER TABLE stores DROP COLUMN operator_code;
