-- The prepaid ledger (预收资金台账) of one store: one row per date of [$2, $3], and one for the
-- day before, with the money coming in (collected), going out of the business (refunded) and
-- the balance the store holds at the end of the day. Earned, the rest of the day's change, is
-- balance(day before) + collected − refunded − balance, computed by the caller, so the identity
-- holds to the cent by construction; what makes earned up is the balance's rules:
--
--   held = wallet money of the store's members (frozen or not)
--        + for each prepaid order of the store (a card, a class pack of more than one session)
--          paid by the end of the day and not refunded by then: amount − earned so far, where
--          a class pack earns amount ÷ sessions (rounded down) per session checked in, all of
--          it with the last; a card amount ÷ plan days per date from its first through the day,
--          all of it on its last.
--
-- Computed as the balance at the end of the day before the range (what each order live then
-- holds, and the wallets), then each day's changes: wallet movements, payments (+ amount),
-- check-ins and card days (− what they earn; a card's daily rate as a difference array, so a
-- card costs two rows however long it runs), refunds (− what the order still held). One pass over
-- the store's prepaid orders, whatever the range's length.
--
--   $1  store id     bigint
--   $2  from         date
--   $3  to           date
--   $4  time zone    text
--   $5  the closing balance of the day before `from` (`prepaid_since` only)     bigint
--   $6  that day's card rate: what the cards held then earn the next day         bigint
--       (`prepaid_since` only)
--
-- The statement is put together from the files of `ledger/`: `head`, the prepaid orders it
-- reads (`prepaid`, then `prepaid_all`: every order live on the eve, the eve's balance
-- computed; or `prepaid_since`, after a closed day: only the orders that change in the range,
-- and what the cards running through it earn a day), `ctes`, the eve's balance (`base_all` /
-- `base_since`) and `select`.
WITH bounds AS (
    SELECT ($2::date::timestamp AT TIME ZONE $4) AS s,
           (($3::date + 1)::timestamp AT TIME ZONE $4) AS e,
           $2::date - 1 AS d0
), days AS (
    SELECT d::date AS day FROM generate_series($2::date - 1, $3::date, interval '1 day') AS d
