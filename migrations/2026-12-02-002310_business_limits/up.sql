-- Business limits (issue 23).
--
-- A member holds at most FITORDER_MAX_OPEN_ORDERS WAIT_PAY orders: placing counts them under the
-- member's row lock, through this index (a member with years of orders is not scanned).
CREATE INDEX orders_member_waiting ON orders (member_id) WHERE status = 'WAIT_PAY';

-- Wallet money stays within GraphQL's Int (every read of a larger balance failed), and one
-- top-up is at most ¥50,000 (the API refuses more, and a balance above ¥1,000,000, before
-- this is reached). NOT VALID: rows written before are history and stay as they are; every
-- new row and every change of a balance is checked.
ALTER TABLE members ADD CONSTRAINT wallet_balance_fits_int
    CHECK (balance_cents <= 2147483647 AND frozen_cents <= 2147483647) NOT VALID;
ALTER TABLE wallet_ledger ADD CONSTRAINT wallet_top_up_in_range
    CHECK (kind <> 'TOP_UP' OR balance_delta BETWEEN 1 AND 5000000) NOT VALID;
