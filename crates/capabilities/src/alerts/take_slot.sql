-- Takes one request from channel $1's allowance: a token bucket of $2 tokens refilled at $2 a
-- minute, in one statement (the row is locked only while it runs). Returns the tokens left;
-- no row when the channel is over its rate.
--
--   $1  channel id            text
--   $2  rate (per minute)     double precision
INSERT INTO alert_channel_tokens AS t (channel, tokens, at)
VALUES ($1, $2 - 1, clock_timestamp())
ON CONFLICT (channel) DO UPDATE
   SET tokens = LEAST($2, t.tokens + extract(epoch FROM clock_timestamp() - t.at) * $2 / 60.0) - 1,
       at = clock_timestamp()
 WHERE LEAST($2, t.tokens + extract(epoch FROM clock_timestamp() - t.at) * $2 / 60.0) >= 1
RETURNING tokens
