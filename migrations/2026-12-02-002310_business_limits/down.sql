ALTER TABLE wallet_ledger DROP CONSTRAINT wallet_top_up_in_range;
ALTER TABLE members DROP CONSTRAINT wallet_balance_fits_int;
DROP INDEX orders_member_waiting;
