DROP INDEX payments_by_paid_at;
DROP INDEX payments_by_txn;
DROP TABLE bill_rows;
