//! The one mapping of the studio's words (`domain` enums) to TEXT columns: each is written as
//! its `as_str()` text and read back with `parse`; a text the enum does not know is an error
//! of the row (the columns' CHECK constraints keep them valid).
//!
//! The diesel traits are implemented here, not derived on the domain types, so that `domain`
//! does not depend on diesel: `#[diesel(foreign_derive)]` on a private proxy struct implements
//! `AsExpression` and `FromSqlRow` for the type of its field.

use std::io::Write;

use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::Text;

use crate::domain::payment::CallbackOutcome;
use crate::domain::{
    AnomalyCategory, CompensationKind, CompensationStatus, FreezeState, MembershipEventKind, MembershipStatus,
    OrderKind, OrderStatus, PayChannel, PaymentMethod, PrepaidPreset, Provider, ReconciliationStatus, TaskRunStatus,
    TicketAction, TicketKind, TicketStatus, WalletMoveKind,
};

macro_rules! text_columns {
    ($($word:ident),* $(,)?) => {$(
        const _: () = {
            #[derive(diesel::expression::AsExpression, diesel::deserialize::FromSqlRow)]
            #[diesel(foreign_derive, sql_type = Text)]
            #[allow(dead_code)]
            struct Proxy($word);

            impl ToSql<Text, Pg> for $word {
                fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
                    out.write_all(self.as_str().as_bytes())?;
                    Ok(IsNull::No)
                }
            }

            impl FromSql<Text, Pg> for $word {
                fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
                    let text = std::str::from_utf8(value.as_bytes())?;
                    $word::parse(text)
                        .ok_or_else(|| format!("unknown {} {text:?} in the database", stringify!($word)).into())
                }
            }
        };
    )*};
}

text_columns!(
    AnomalyCategory,
    CallbackOutcome,
    CompensationKind,
    CompensationStatus,
    FreezeState,
    MembershipEventKind,
    MembershipStatus,
    OrderKind,
    OrderStatus,
    PayChannel,
    PaymentMethod,
    PrepaidPreset,
    Provider,
    ReconciliationStatus,
    TaskRunStatus,
    TicketAction,
    TicketKind,
    TicketStatus,
    WalletMoveKind,
);
