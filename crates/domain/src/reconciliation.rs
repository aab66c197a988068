//! Reconciliation runs.

use super::vocabulary::vocabulary;

vocabulary! {
    /// Where a run of one provider's bill of one day stands.
    pub enum ReconciliationStatus {
        Running = "RUNNING",
        Succeeded = "SUCCEEDED",
        Failed = "FAILED",
        /// The provider has not made the bill yet: asked again later.
        Waiting = "WAITING",
    }
}
