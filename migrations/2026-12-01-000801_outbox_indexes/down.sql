DROP INDEX compensation_delivered;
DROP INDEX ticket_refund_mismatch;
DROP INDEX compensation_refund_by_order;
DROP INDEX compensation_refund_by_txn;
