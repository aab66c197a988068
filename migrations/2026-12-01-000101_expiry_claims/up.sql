-- Which instance is asking the provider about a due order, until when: every due trade is
-- queried by one instance at a time, and a killed instance's claims lapse.
CREATE TABLE expiry_claims (
    order_id      BIGINT PRIMARY KEY REFERENCES orders (id),
    claimed_until TIMESTAMPTZ NOT NULL,
    claimed_by    TEXT NOT NULL
);
