//! Pure rules of the studio's business: no I/O, no clock, no database. Everything here is
//! decided from its arguments, so it is tested exhaustively with plain unit tests.

pub mod actor;
pub mod effect;
pub mod money;
pub mod order_status;
pub mod payment;
pub mod retry;
pub mod schedule;

pub use actor::{Actor, ActorKind, Ctx, TraceId};
pub use effect::{CompensationKind, CompensationStatus, Effect};
pub use order_status::{OrderStatus, TransitionError, TIMEOUT_REASON};
