-- One refund per provider transaction for money that reached no order of its own: whichever
-- ticket about a stray payment is resolved with REFUND first claims the transaction here, in
-- the same transaction as its PROVIDER_REFUND event; concurrent resolutions of other tickets
-- about the same payment wait on the key and then find it taken.
CREATE TABLE stray_payment_refunds (
    provider TEXT NOT NULL,
    provider_txn_id TEXT NOT NULL,
    ticket_id BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, provider_txn_id)
);

-- The refunds tickets already queued (refund numbers TK<ticket id>).
INSERT INTO stray_payment_refunds (provider, provider_txn_id, ticket_id, created_at)
SELECT DISTINCT ON (payload->>'provider', payload->>'providerTxnId')
       payload->>'provider', payload->>'providerTxnId', substr(payload->>'refundNo', 3)::bigint, created_at
  FROM compensation_events
 WHERE kind = 'PROVIDER_REFUND' AND payload->>'refundNo' ~ '^TK[0-9]+$'
   AND payload->>'providerTxnId' IS NOT NULL AND payload->>'provider' IS NOT NULL
 ORDER BY payload->>'provider', payload->>'providerTxnId', id
ON CONFLICT DO NOTHING;
