DROP INDEX IF EXISTS payment_callbacks_unverified;
