-- Claims due WAIT_PAY orders of the providers in $1, at most $2, for the lease $3, by $4.
-- The order rows are locked only for this statement (SKIP LOCKED: two instances claiming at
-- the same moment take different rows); the claim row keeps them away from other instances
-- until it lapses.
WITH due AS (
    SELECT o.id
      FROM orders o
     WHERE o.status = 'WAIT_PAY' AND o.expires_at IS NOT NULL AND o.expires_at <= now()
       AND o.online_provider = ANY($1)
       AND NOT EXISTS (SELECT 1 FROM expiry_claims c WHERE c.order_id = o.id AND c.claimed_until > now())
     ORDER BY o.expires_at
     LIMIT $2
       FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    INSERT INTO expiry_claims AS c (order_id, claimed_until, claimed_by)
    SELECT id, now() + $3, $4 FROM due
    ON CONFLICT (order_id) DO UPDATE
       SET claimed_until = EXCLUDED.claimed_until, claimed_by = EXCLUDED.claimed_by
     WHERE c.claimed_until <= now()
    RETURNING c.order_id
)
SELECT o.id, o.order_no, o.online_provider, o.expires_at
  FROM orders o JOIN claimed ON claimed.order_id = o.id
 ORDER BY o.expires_at
