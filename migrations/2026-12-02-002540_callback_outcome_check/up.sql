-- payment_callbacks.outcome is a closed vocabulary (domain::CallbackOutcome, read back as that
-- enum), checked like every other such column. NOT VALID: rows written before are history and
-- stay as they are; every new row and every change of an outcome is checked.
ALTER TABLE payment_callbacks ADD CONSTRAINT payment_callbacks_outcome_check
    CHECK (outcome IN ('RECEIVED', 'APPLIED', 'DUPLICATE', 'PAID_AFTER_CANCEL', 'AMOUNT_MISMATCH',
                       'REJECTED_TRANSITION', 'UNKNOWN_ORDER', 'BAD_SIGNATURE', 'REFUND_RECORDED',
                       'REFUND_FAILED', 'REFUND_MISMATCH', 'RECORDED')) NOT VALID;
