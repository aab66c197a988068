//! Hand-written SQL, the reviewed way: a statement's text is fixed at compile time (an
//! `include_str!` of a `.sql` file next to the module that runs it) and its binds are typed.
//!
//! `diesel::sql_query` marks every statement unsafe to cache (its text could be anything built
//! at run time, and an unbounded cache would grow with it), so each call prepares the statement
//! again: one more round trip, and the planning, every time. A [`StaticQuery`] has a `'static`
//! text, so the set of texts is as fixed as the program: it leaves the statement cacheable and
//! diesel-async's per-connection statement cache keys it by its SQL text (and bind types) —
//! prepared once per connection, then only bound and executed.
//!
//! The SQL functions that are not statements of their own (`pg_notify`, `fitorder_announce`,
//! advisory locks) are declared here for diesel's DSL, so that they, too, are typed and cached.

use std::marker::PhantomData;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::QueryResult;

/// A statement with a compile-time text and typed positional binds, `$1` first.
///
/// ```ignore
/// StaticQuery::new(include_str!("transition.sql"))
///     .bind::<BigInt, _>(order.id)
///     .bind::<Text, _>(to) // an OrderStatus, through db::vocabulary
/// ```
///
/// Results load like `sql_query`'s, by column name (`QueryableByName`).
#[derive(Debug, Clone, Copy)]
#[must_use = "a query is only run by `execute`, `load` or `get_result`"]
pub struct StaticQuery<B = NoBinds> {
    sql: &'static str,
    binds: B,
}

/// No binds yet.
#[derive(Debug, Clone, Copy)]
pub struct NoBinds;

/// The binds before, then one value of SQL type `ST`.
#[derive(Debug, Clone, Copy)]
pub struct Bind<Before, T, ST> {
    before: Before,
    value: T,
    sql_type: PhantomData<ST>,
}

impl StaticQuery {
    pub const fn new(sql: &'static str) -> StaticQuery {
        StaticQuery { sql, binds: NoBinds }
    }
}

impl<B> StaticQuery<B> {
    /// Binds the next placeholder (`$1`, then `$2`, ...) to `value` as SQL type `ST`.
    pub fn bind<ST, T>(self, value: T) -> StaticQuery<Bind<B, T, ST>> {
        StaticQuery {
            sql: self.sql,
            binds: Bind {
                before: self.binds,
                value,
                sql_type: PhantomData,
            },
        }
    }

    /// The statement's text.
    pub fn sql(&self) -> &'static str {
        self.sql
    }
}

/// Binds walk in order: the ones before first.
pub trait Binds {
    fn walk<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

impl Binds for NoBinds {
    fn walk<'b>(&'b self, _out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        Ok(())
    }
}

impl<Before, T, ST> Binds for Bind<Before, T, ST>
where
    Before: Binds,
    Pg: HasSqlType<ST>,
    T: ToSql<ST, Pg>,
{
    fn walk<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.before.walk(out)?;
        out.push_bind_param_value_only(&self.value)
    }
}

impl<B: Binds> QueryFragment<Pg> for StaticQuery<B> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // Deliberately no `out.unsafe_to_cache_prepared()`: the text is 'static.
        out.push_sql(self.sql);
        self.binds.walk(&mut out)
    }
}

/// No static query id: the cache keys the statement by its text and bind types (a static id
/// would make every `StaticQuery` with the same bind types one cache entry).
impl<B> QueryId for StaticQuery<B> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<B> Query for StaticQuery<B> {
    type SqlType = Untyped;
}

/// PostgreSQL's `void`, what `pg_notify` and the advisory lock functions return.
#[derive(Debug, Clone, Copy, Default, diesel::sql_types::SqlType, diesel::query_builder::QueryId)]
#[diesel(postgres_type(oid = 2278, array_oid = 0))]
pub struct Void;

diesel::define_sql_function! {
    /// Sends `payload` on `channel` when the transaction commits (at once outside one).
    fn pg_notify(channel: diesel::sql_types::Text, payload: diesel::sql_types::Text) -> Void;
}

diesel::define_sql_function! {
    /// Announces a changed row to subscribers when the transaction commits: `<what>:<id>` on
    /// the events channel, built by the database function every statement that changes rows
    /// calls too (migration `announce`). See `events::announce`.
    fn fitorder_announce(what: diesel::sql_types::Text, id: diesel::sql_types::BigInt) -> Void;
}

diesel::define_sql_function! {
    /// Takes the session-level advisory lock `key`, waiting until it is free.
    fn pg_advisory_lock(key: diesel::sql_types::BigInt) -> Void;
}

diesel::define_sql_function! {
    /// Releases the session-level advisory lock `key`; false when it was not held.
    fn pg_advisory_unlock(key: diesel::sql_types::BigInt) -> diesel::sql_types::Bool;
}

diesel::define_sql_function! {
    /// Takes the advisory lock `key` until the transaction ends, waiting until it is free.
    fn pg_advisory_xact_lock(key: diesel::sql_types::BigInt) -> Void;
}

/// The advisory lock keys fitorder takes, in one place so that two never collide (the test
/// harness takes 7_250_002 while it builds its template database).
pub mod lock_keys {
    /// Migrations (session-level, on the migrating connection).
    pub const MIGRATIONS: i64 = 7_250_001;
}
