-- Writes how callback $1 ended, with what it was about, in the transaction that applied it.
-- (A diesel UPDATE is never kept prepared: its SET list may vary with the values. This one
-- runs for every notification, so it is written out and stays prepared.)
--
--   $1  callback id                bigint
--   $2  outcome                    text
--   $3  order id                   bigint, NULL (not ours)
--   $4  order number               text, NULL
--   $5  store id                   bigint, NULL
--   $6  idempotency key            text, NULL (a notice that changes nothing)
--   $7  provider transaction id    text, NULL
--   $8  amount (cents)             bigint, NULL
UPDATE payment_callbacks
   SET outcome = $2, order_id = $3, order_no = $4, store_id = $5, idempotency_key = $6,
       provider_txn_id = $7, amount_cents = $8
 WHERE id = $1
