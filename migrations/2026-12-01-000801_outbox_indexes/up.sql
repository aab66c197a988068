-- The refund events' payload is looked up by its fields (a stray payment's refund, a refund
-- callback's order, the bill's refund rows and the day's refunds of a provider): expression indexes over
-- exactly those lookups, so none of them scans the outbox.
CREATE INDEX compensation_refund_by_txn ON compensation_events ((payload->>'providerTxnId'))
    WHERE kind = 'PROVIDER_REFUND';
CREATE INDEX compensation_refund_by_order ON compensation_events
    ((payload->>'provider'), (payload->>'orderNo'), (payload->>'refundNo'))
    WHERE kind = 'PROVIDER_REFUND';
-- A bill's refund row against the callback's REFUND_MISMATCH ticket of the same refund.
CREATE INDEX ticket_refund_mismatch ON exception_tickets (order_no, (detail->>'refundNo'))
    WHERE kind = 'REFUND_MISMATCH';
-- data:cleanup finds delivered events past the retention window by when they were delivered.
CREATE INDEX compensation_delivered ON compensation_events (updated_at) WHERE status = 'SUCCEEDED';
