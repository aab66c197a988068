DROP TABLE wechat_platform_cert_refreshes;
DROP TABLE wechat_platform_certs;
