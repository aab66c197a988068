//! What the anomaly statistics count.

use super::vocabulary::vocabulary;

vocabulary! {
    /// A category of anomaly (`anomalyStats`).
    pub enum AnomalyCategory {
        DuplicateCallback = "DUPLICATE_CALLBACK",
        BadSignature = "BAD_SIGNATURE",
        IllegalTransition = "ILLEGAL_TRANSITION",
        PaidAfterCancel = "PAID_AFTER_CANCEL",
        AmountMismatch = "AMOUNT_MISMATCH",
        OrderExpired = "ORDER_EXPIRED",
        DuplicateCheckIn = "DUPLICATE_CHECK_IN",
        CompensationRetry = "COMPENSATION_RETRY",
        CompensationDead = "COMPENSATION_DEAD",
        ReconciliationFinding = "RECONCILIATION_FINDING",
    }
}
