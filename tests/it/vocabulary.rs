//! The studio's words (the `domain` enums) and the database agree: every word goes through
//! `db::vocabulary`'s mapping and comes back the same, and each constrained column allows
//! exactly the words of its enum.

use std::collections::BTreeSet;

use diesel::prelude::*;
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use fitorder::domain::{
    AnomalyCategory, CallbackOutcome, CompensationKind, CompensationStatus, FreezeState, MembershipEventKind,
    MembershipStatus, OrderKind, OrderStatus, PayChannel, PaymentMethod, PrepaidPreset, Provider, ReconciliationStatus,
    TaskRunStatus, TicketAction, TicketKind, TicketStatus, WalletMoveKind,
};

use crate::harness::*;

/// The words a CHECK constraint on `table.column` allows (`column IN ('A', 'B')` as Postgres
/// shows it: `column = ANY (ARRAY['A'::text, 'B'::text])`).
async fn allowed(app: &TestApp, table: &str, column: &str) -> BTreeSet<String> {
    #[derive(diesel::QueryableByName)]
    struct Def {
        #[diesel(sql_type = Text)]
        def: String,
    }
    let mut c = app.conn().await;
    let defs: Vec<Def> = diesel::sql_query(
        "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint
          WHERE conrelid = $1::regclass AND contype = 'c'",
    )
    .bind::<Text, _>(table)
    .load(&mut c)
    .await
    .unwrap();
    let def = defs
        .iter()
        .map(|d| d.def.as_str())
        .find(|d| d.starts_with(&format!("CHECK (({column} = ANY (ARRAY[")))
        .unwrap_or_else(|| panic!("no CHECK constraint on {table}.{column}"));
    let list = &def[def.find("ARRAY[").expect("a list of words") + 6..];
    let list = &list[..list.find(']').unwrap()];
    list.split(',')
        .map(|w| w.trim().trim_end_matches("::text").trim_matches('\'').to_string())
        .collect()
}

fn texts<W: std::fmt::Display>(words: impl IntoIterator<Item = W>) -> BTreeSet<String> {
    words.into_iter().map(|w| w.to_string()).collect()
}

/// Each word written as a bind parameter and read back as the enum.
macro_rules! round_trips {
    ($c:expr, $($word:ty),* $(,)?) => {$(
        for w in <$word>::ALL {
            let back: $word = diesel::select(w.into_sql::<Text>()).get_result($c).await.unwrap();
            assert_eq!(back, w, "{}", stringify!($word));
            let text: String = diesel::select(w.into_sql::<Text>()).get_result($c).await.unwrap();
            assert_eq!(text, w.as_str(), "{}", stringify!($word));
        }
    )*};
}

#[tokio::test]
async fn every_word_round_trips_through_postgres() {
    let app = TestApp::new().await;
    let mut c = app.conn().await;
    round_trips!(
        &mut c,
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
    // A text that is no word of the enum is an error of the row, not some default.
    let unknown: Result<OrderStatus, _> = diesel::select("SHIPPED".into_sql::<Text>()).get_result(&mut c).await;
    assert!(unknown.is_err());
}

#[tokio::test]
async fn constrained_columns_allow_exactly_the_enums_words() {
    let app = TestApp::new().await;
    let cases = [
        ("orders", "kind", texts(OrderKind::ALL)),
        ("orders", "status", texts(OrderStatus::ALL)),
        ("orders", "payment_method", texts(PaymentMethod::ALL)),
        ("orders", "online_provider", texts(Provider::ALL)),
        ("wallet_ledger", "kind", texts(WalletMoveKind::ALL)),
        ("memberships", "status", texts(MembershipStatus::ALL)),
        ("membership_events", "kind", texts(MembershipEventKind::ALL)),
        ("membership_freezes", "state", texts(FreezeState::ALL)),
        ("exception_tickets", "kind", texts(TicketKind::ALL)),
        ("exception_tickets", "status", texts(TicketStatus::ALL)),
        ("exception_tickets", "provider", texts(Provider::ALL)),
        ("exception_tickets", "resolution", texts(TicketAction::ALL)),
        ("reconciliation_runs", "provider", texts(Provider::ALL)),
        ("reconciliation_runs", "status", texts(ReconciliationStatus::ALL)),
        ("payment_callbacks", "provider", texts(Provider::ALL)),
        ("payment_callbacks", "outcome", texts(CallbackOutcome::ALL)),
        ("compensation_events", "kind", texts(CompensationKind::ALL)),
        ("compensation_events", "status", texts(CompensationStatus::ALL)),
        ("task_runs", "status", texts(TaskRunStatus::ALL)),
        ("payment_trades", "provider", texts(Provider::ALL)),
        ("payment_trades", "channel", texts(PayChannel::ALL)),
        ("prepaid_rules", "preset", texts(PrepaidPreset::ALL)),
    ];
    for (table, column, words) in cases {
        assert_eq!(allowed(&app, table, column).await, words, "{table}.{column}");
    }
}
