//! Pure rules of the studio's business: no I/O, no clock, no database. Everything here is
//! decided from its arguments, so it is tested exhaustively with plain unit tests.
//!
//! The studio's vocabulary lives here too, one enum per kind of word ([`vocabulary`]); the
//! database and the GraphQL API map these enums, they do not define words of their own.

pub mod actor;
pub mod anomaly;
pub mod effect;
pub mod membership;
pub mod money;
pub mod order;
pub mod order_status;
pub mod payment;
pub mod prepaid;
pub mod reconciliation;
pub mod refusal;
pub mod retry;
pub mod schedule;
/// The TEXT-column mapping of these words for diesel (the `diesel` feature; the orphan rule
/// puts the impls beside the types).
#[cfg(feature = "diesel")]
pub mod sql;
pub mod ticket;
pub mod vocabulary;
pub mod wallet;

// `crate::domain::…` paths read the same in every crate of the workspace.
use crate as domain;

pub use actor::{Actor, ActorKind, Ctx, TraceId};
pub use anomaly::AnomalyCategory;
pub use effect::{CompensationKind, CompensationStatus, Effect};
pub use membership::{FreezeState, MembershipEventKind, MembershipStatus};
pub use order::{OrderKind, PaymentMethod, TimelineKind, TIMEOUT_REASON};
pub use order_status::{OrderStatus, TransitionError};
pub use payment::{CallbackOutcome, PayChannel, Provider};
pub use prepaid::{PrepaidLimit, PrepaidPreset, PrepaidRules};
pub use reconciliation::ReconciliationStatus;
pub use refusal::Refusal;
pub use schedule::TaskRunStatus;
pub use ticket::{AlertCause, TicketAction, TicketKind, TicketStatus};
pub use wallet::WalletMoveKind;
