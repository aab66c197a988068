-- Alipay public-key certificates fitorder downloaded when an answer or notification named an
-- alipay_cert_sn other than the configured ALIPAY_PUBLIC_CERT (Alipay renewed its certificate):
-- checked against ALIPAY_ROOT_CERT before they are stored, shared by every instance.
CREATE TABLE alipay_public_certs (
    alipay_cert_sn text PRIMARY KEY,
    pem            text NOT NULL,
    not_after      timestamptz NOT NULL,
    fetched_at     timestamptz NOT NULL DEFAULT now()
);
