DROP TABLE payment_keys;
DROP TABLE reconciliation_runs;
DROP TABLE exception_tickets;
DROP TABLE payment_callbacks;
