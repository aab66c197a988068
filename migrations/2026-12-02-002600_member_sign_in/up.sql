-- Members sign in from the WeChat mini program (issue 26).
--
-- A WeChat account (its openid under WECHAT_MINIPROGRAM_APP_ID, and its unionid when WeChat
-- gives one) is bound to exactly one member, and a member to at most one account: the unique
-- keys decide between two sign-ins racing for the same new openid.
CREATE TABLE wechat_bindings (
    openid      TEXT PRIMARY KEY CHECK (openid ~ '^[A-Za-z0-9_-]{1,128}$'),
    unionid     TEXT CHECK (unionid ~ '^[A-Za-z0-9_-]{1,128}$'),
    member_id   BIGINT NOT NULL REFERENCES members (id),
    bound_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT wechat_bindings_one_per_member UNIQUE (member_id),
    CONSTRAINT wechat_bindings_unionid_key UNIQUE (unionid)
);

-- A sign-in's session: every access token names it (`sid`), every refresh token belongs to it.
-- Ended by signOut or by a spent refresh token presented again (the whole family dies).
CREATE TABLE member_sessions (
    id          TEXT PRIMARY KEY CHECK (id ~ '^[0-9a-f]{32}$'),
    member_id   BIGINT NOT NULL REFERENCES members (id),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at    TIMESTAMPTZ,
    end_reason  TEXT CHECK (end_reason IN ('SIGNED_OUT', 'REFRESH_REUSED')),
    CONSTRAINT member_sessions_ended_with_reason CHECK ((ended_at IS NULL) = (end_reason IS NULL))
);
CREATE INDEX member_sessions_member ON member_sessions (member_id);
-- What every instance loads into its cache of ended sessions when it (re)connects.
CREATE INDEX member_sessions_ended ON member_sessions (ended_at) WHERE ended_at IS NOT NULL;

-- Refresh tokens: only the SHA-256 of the 256 random bits is kept. One use: `spent_at` is set
-- when it is exchanged for the next one.
CREATE TABLE refresh_tokens (
    hash        BYTEA PRIMARY KEY CHECK (length(hash) = 32),
    session_id  TEXT NOT NULL REFERENCES member_sessions (id),
    expires_at  TIMESTAMPTZ NOT NULL,
    spent_at    TIMESTAMPTZ
);
CREATE INDEX refresh_tokens_session ON refresh_tokens (session_id);

-- The mini program's access_token (getuserphonenumber needs it), one for the whole cluster:
-- WeChat invalidates older tokens when a new one is fetched and rate-limits the fetch, so the
-- instance that holds this row's lock fetches and the others wait and read.
CREATE TABLE wechat_access_tokens (
    app_id      TEXT PRIMARY KEY,
    token       TEXT,
    expires_at  TIMESTAMPTZ,
    fetched_at  TIMESTAMPTZ
);
