-- WeChat Pay platform certificates from GET /v3/certificates, shared by every instance.
CREATE TABLE wechat_platform_certs (
    serial_no    text PRIMARY KEY,
    pem          text NOT NULL,
    effective_at timestamptz,
    expire_at    timestamptz,
    fetched_at   timestamptz NOT NULL DEFAULT now()
);

-- When the certificates were last fetched from the provider, and when an instance last claimed
-- a forced (unknown-serial) fetch: the claim is a conditional upsert on this row, so N instances
-- seeing the same unknown serial make one call to the provider per minute, not N.
CREATE TABLE wechat_platform_cert_refreshes (
    scope           text PRIMARY KEY,
    last_attempt_at timestamptz,
    last_success_at timestamptz
);
