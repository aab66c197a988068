-- Orders are born WAIT_PAY (the status guard allows no other birth): the column's default, so
-- that placing an order does not write the status itself and only `orders/transition.sql` (and
-- `orders/pay.sql`, WAIT_PAY -> PAID) write it.
ALTER TABLE orders ALTER COLUMN status SET DEFAULT 'WAIT_PAY';
