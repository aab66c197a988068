DROP TABLE alert_attempts;
DROP TABLE alert_deliveries;
DROP TABLE alerts;
