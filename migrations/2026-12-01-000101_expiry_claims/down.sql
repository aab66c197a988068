DROP TABLE expiry_claims;
