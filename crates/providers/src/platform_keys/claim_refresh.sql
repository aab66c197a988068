-- Claims a forced fetch of the platform certificates for scope $1 at $2: one statement, so the
-- row lock of ON CONFLICT DO UPDATE serializes racing instances and the WHERE is evaluated on
-- the latest row; exactly one of them gets a row back. Refused (no row) when the last attempt
-- was after $3 (and not in the future: a clock that jumped back does not block for good).
--
--   $1  scope                               text
--   $2  now                                 timestamptz
--   $3  now minus the minimum interval      timestamptz
INSERT INTO wechat_platform_cert_refreshes AS r (scope, last_attempt_at) VALUES ($1, $2)
ON CONFLICT (scope) DO UPDATE SET last_attempt_at = EXCLUDED.last_attempt_at
 WHERE r.last_attempt_at IS NULL OR r.last_attempt_at <= $3 OR r.last_attempt_at > $2
RETURNING r.scope
