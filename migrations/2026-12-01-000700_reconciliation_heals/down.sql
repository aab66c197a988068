DROP TABLE reconciliation_heals;
