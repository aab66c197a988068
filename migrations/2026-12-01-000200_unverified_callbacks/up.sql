-- Unverified callbacks (anybody's traffic) are pruned by age and count by data:cleanup.
CREATE INDEX payment_callbacks_unverified ON payment_callbacks (id) WHERE NOT verified;
