DROP TABLE alipay_public_certs;
