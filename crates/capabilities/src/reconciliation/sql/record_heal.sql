-- One finding a reconciliation settled by itself (what it was, what was done, under which run).
--
--   $1  run id                    bigint
--   $2  provider                  text
--   $3  bill date                 date
--   $4  category (the finding)    text
--   $5  action                    text
--   $6  order number              text
--   $7  provider transaction id   text, NULL
--   $8  trace id                  text
INSERT INTO reconciliation_heals (run_id, provider, bill_date, category, action, order_no, provider_txn_id, trace_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
