-- The one writer of exception tickets. This text follows `WITH findings AS (<a query>)`
-- (`tickets::opening` puts the two together): every row of `findings` opens its ticket unless
-- one was opened for the same finding (`finding_key`), however often the finding is made; each
-- new ticket is announced (`ticket:<id>` on `fitorder_events`, on commit). Returns the new
-- tickets, whole.
--
-- `findings` has these columns (named so, any order; NULLs typed):
--   kind text, provider text, order_id bigint, order_no text, store_id bigint,
--   provider_txn_id text, local_amount_cents bigint, provider_amount_cents bigint,
--   detail jsonb, finding_key text, trace_id text
, opened AS (
    INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                   local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
    SELECT f.kind, f.provider, f.order_id, f.order_no, f.store_id, f.provider_txn_id,
           f.local_amount_cents, f.provider_amount_cents, f.detail, f.finding_key, f.trace_id
      FROM findings f
    ON CONFLICT (finding_key) DO NOTHING
    RETURNING *)
SELECT o.*, fitorder_announce('ticket', o.id) AS announced FROM opened o
