//! A membership card's life.

use super::vocabulary::vocabulary;

vocabulary! {
    /// ACTIVE while paid for and not refunded (valid between its dates); EXPIRED once over;
    /// REVOKED when its order was refunded.
    pub enum MembershipStatus {
        Active = "ACTIVE",
        Expired = "EXPIRED",
        Revoked = "REVOKED",
    }
}
