DROP TABLE stray_payment_refunds;
