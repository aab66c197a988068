//! Why a request is refused in words a client acts on: the `extensions.reason` of a
//! `BAD_USER_INPUT` answer (`AppError::Refused`). The reasons of the refusals that carry more
//! (`PREPAID_LIMIT`, `TERMS_NOT_ACCEPTED`) come with their own `AppError` variants.

use super::vocabulary::vocabulary;

vocabulary! {
    /// The `extensions.reason` of a refusal: the one place its words are spelled.
    pub enum Refusal {
        /// A member's first sign-in without `phoneCode`: the mini program asks for the phone
        /// number (getPhoneNumber) and signs in again.
        PhoneRequired = "PHONE_REQUIRED",
        /// A first sign-in of a phone no member has, without `storeId`: the new member must
        /// name the store they join.
        StoreRequired = "STORE_REQUIRED",
        /// Too many requests of one kind from one key (sign-ins, placing orders): try again
        /// after `extensions.retryAfter` seconds (and the `Retry-After` header).
        RateLimited = "RATE_LIMITED",
        /// Placing an order while the member has as many unpaid orders as the service allows:
        /// pay or cancel one first.
        TooManyOpenOrders = "TOO_MANY_OPEN_ORDERS",
        /// The card is frozen: no check-in, no transfer while a freeze runs.
        MembershipFrozen = "MEMBERSHIP_FROZEN",
        /// The card is not in use (expired, revoked, or its validity is over): it cannot be
        /// frozen or transferred.
        MembershipNotActive = "MEMBERSHIP_NOT_ACTIVE",
        /// The card was transferred already: a card is transferred once, and its order can no
        /// longer be refunded.
        MembershipTransferred = "MEMBERSHIP_TRANSFERRED",
        /// Ending or calling off a freeze of a card that has no running or scheduled freeze.
        NotFrozen = "NOT_FROZEN",
        /// A freeze request the rules refuse as asked (its days, its first day).
        InvalidFreeze = "INVALID_FREEZE",
        /// A freeze over the plan's limits (how many freezes, how many days), or overlapping
        /// another freeze of the card.
        FreezeLimit = "FREEZE_LIMIT",
        /// A transfer's fee out of range (0 to 10 000 000 cents).
        InvalidFee = "INVALID_FEE",
        /// A transfer to the member who holds the card already.
        SameMember = "SAME_MEMBER",
        /// A transfer to a member of another business operator's store.
        OtherOperator = "OTHER_OPERATOR",
        /// A member's cooling-off refund after its period ended, or of an order that has none.
        CoolingOffEnded = "COOLING_OFF_ENDED",
        /// A member's cooling-off refund of an order part of which was used: staff refund the
        /// unused share.
        AlreadyUsed = "ALREADY_USED",
        /// A catalog item that was retired: it is sold no more and cannot be changed.
        Retired = "RETIRED",
        /// A search filter that cannot be asked (a phone that is neither four digits nor a
        /// whole number, a name part too short to look for).
        InvalidFilter = "INVALID_FILTER",
        /// Canceling a coach's session that has started already (`cancelCoachSlot`).
        SlotStarted = "SLOT_STARTED",
        /// Booking, or checking in to, a coach's session that was canceled.
        SlotCanceled = "SLOT_CANCELED",
        /// A report's dates out of order, out of 2000..2100, or more days than it covers
        /// (`salesReport`: 366).
        InvalidRange = "INVALID_RANGE",
    }
}
