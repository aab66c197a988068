-- One finding, for `tickets::open` (followed by `tickets/open.sql`).
--
--   $1  kind                    text
--   $2  provider                text, NULL
--   $3  order id                bigint, NULL
--   $4  order number            text, NULL
--   $5  store id                bigint, NULL
--   $6  provider transaction    text, NULL
--   $7  local amount (cents)    bigint, NULL
--   $8  provider amount (cents) bigint, NULL
--   $9  detail                  jsonb
--   $10 finding key             text
--   $11 trace id                text
SELECT $1::text AS kind, $2::text AS provider, $3::bigint AS order_id, $4::text AS order_no,
       $5::bigint AS store_id, $6::text AS provider_txn_id, $7::bigint AS local_amount_cents,
       $8::bigint AS provider_amount_cents, $9::jsonb AS detail, $10::text AS finding_key,
       $11::text AS trace_id
