-- What one member holds with one business operator now: the migration's `prepaid_holdings`
-- (migrations/2026-12-05-000100_prepaid_holdings), which says what it counts.
--
--   $1  member id        bigint
--   $2  operator code    text
--   $3  today            date    (business time zone)
--   $4  time zone        text
SELECT membership_cents, membership_days, sessions_cents, sessions_count, wallet_cents, total_cents
  FROM prepaid_holdings($1, $2, $3, $4)
