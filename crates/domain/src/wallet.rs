//! Movements of a member's wallet money (`wallet_ledger.kind`).

use super::vocabulary::vocabulary;

vocabulary! {
    /// What a wallet movement is.
    pub enum WalletMoveKind {
        /// Money added by staff.
        TopUp = "TOP_UP",
        /// A WALLET order paid from the balance.
        Pay = "PAY",
        /// The wallet part of a MIXED order held while the online part is paid.
        Freeze = "FREEZE",
        /// A held part given back (the MIXED order was canceled).
        Unfreeze = "UNFREEZE",
        /// A held part taken (the MIXED order was paid).
        Capture = "CAPTURE",
        /// The wallet share of a refund.
        Refund = "REFUND",
        /// A fee charged from the wallet (a card's transfer, 转卡).
        Fee = "FEE",
    }
}
