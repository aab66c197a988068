//! `TestApp`: a real database (fresh per test, from a migrated template), the real router,
//! helpers that speak GraphQL the way the clients do.

use fitorder::config::ExposeSecret;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use fitorder::app::AppState;
use fitorder::auth::{issue_token, Role};
use fitorder::config::Config;
use fitorder::db::DbConn;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use tower::ServiceExt;

/// The maintenance URL of the server the tests use, and the template database's name.
struct Server {
    admin_url: String,
    template: String,
}

static SERVER: OnceCell<Server> = OnceCell::const_new();
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn with_db(url: &str, db: &str) -> String {
    // postgres://user@host:port/db?params -> same with another db
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[scheme_end..]
        .find('/')
        .map(|i| i + scheme_end)
        .unwrap_or(base.len());
    format!("{}/{}{}", &base[..path_start], db, query)
}

async fn server() -> &'static Server {
    SERVER
        .get_or_init(|| async {
            let admin_url = match std::env::var("TEST_DATABASE_URL").or_else(|_| std::env::var("DATABASE_URL")) {
                Ok(url) if !url.is_empty() => with_db(&url, "postgres"),
                _ => {
                    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fitorder-test-pg");
                    let dev = tokio::task::spawn_blocking(move || fitorder::dev::dev_pg::DevPostgres::ensure(&dir))
                        .await
                        .unwrap()
                        .expect("no TEST_DATABASE_URL and no local PostgreSQL to start");
                    // Left running for the next test run (it is reused); `pg_ctl -D
                    // target/fitorder-test-pg/data stop` or `cargo clean` removes it.
                    dev.url("postgres")
                }
            };
            let template = format!("fitorder_tpl_{}", migrations_hash());
            let mut conn = AsyncPgConnection::establish(&admin_url)
                .await
                .unwrap_or_else(|e| panic!("cannot reach the test PostgreSQL at {admin_url}: {e}"));
            // One process at a time builds the template.
            diesel::sql_query("SELECT pg_advisory_lock(7250002)")
                .execute(&mut conn)
                .await
                .unwrap();
            #[derive(diesel::QueryableByName)]
            struct N {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            let exists: N = diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
                .bind::<diesel::sql_types::Text, _>(&template)
                .get_result(&mut conn)
                .await
                .unwrap();
            if exists.n == 0 {
                let building = format!("{template}_building");
                diesel::sql_query(format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                diesel::sql_query(format!("CREATE DATABASE {building}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                fitorder::db::migrate(&with_db(&admin_url, &building)).await.unwrap();
                // The migration's connection may linger for a moment; the rename needs none.
                diesel::sql_query(format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{building}'"
                ))
                .execute(&mut conn)
                .await
                .unwrap();
                diesel::sql_query(format!("ALTER DATABASE {building} RENAME TO {template}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            // Leftovers of earlier runs that died before dropping their databases.
            #[derive(diesel::QueryableByName)]
            struct Name {
                #[diesel(sql_type = diesel::sql_types::Text)]
                datname: String,
            }
            let stale: Vec<Name> = diesel::sql_query(
                "SELECT datname FROM pg_database WHERE datname ~ '^fitorder_t_[0-9]+_[0-9]+$' \
                 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = pg_database.datname)",
            )
            .load(&mut conn)
            .await
            .unwrap();
            for s in stale {
                let owner_pid: Option<u32> = s.datname.split('_').nth(2).and_then(|p| p.parse().ok());
                let alive = owner_pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
                if !alive {
                    let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", s.datname))
                        .execute(&mut conn)
                        .await;
                }
            }
            diesel::sql_query("SELECT pg_advisory_unlock(7250002)")
                .execute(&mut conn)
                .await
                .unwrap();
            Server { admin_url, template }
        })
        .await
}

fn migrations_hash() -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut entries: Vec<_> = walk(&dir);
    entries.sort();
    for p in entries {
        h.update(p.to_string_lossy().as_bytes());
        h.update(std::fs::read(&p).unwrap());
    }
    hex::encode(&h.finalize()[..6])
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The caller's address as the test load balancer reports it (`X-Forwarded-For`).
pub const TEST_CLIENT_IP: &str = "198.51.100.20";

pub struct TestApp {
    /// The provider sandbox (WeChat Pay and Alipay on loopback) this app's providers point at.
    pub sandbox: fitorder::dev::sandbox_server::SandboxProvider,
    pub state: AppState,
    pub router: Router,
    pub db_url: String,
    db_name: String,
    admin_url: String,
    /// Whether the test means to leave DEAD outbox events or alert deliveries behind
    /// ([`TestApp::expect_dead`]); otherwise one left behind fails the test when the app is
    /// dropped (as crates.io's `TestApp` fails a test that leaves background jobs behind).
    dead_expected: std::sync::atomic::AtomicBool,
}

/// A sandbox of this test's own (order numbers repeat across test databases).
async fn sandbox() -> fitorder::dev::sandbox_server::SandboxProvider {
    fitorder::dev::sandbox_server::SandboxProvider::start(crate::providers::sandbox_keys(), "127.0.0.1:0")
        .await
        .expect("the provider sandbox starts")
}

/// Both providers configured whole, their APIs at `sandbox`.
fn point_at(config: &mut Config, sandbox: &fitorder::dev::sandbox_server::SandboxProvider) {
    crate::providers::configure(config);
    config.wechatpay.api_base = sandbox.wechat_api_base();
    config.alipay.api_base = sandbox.alipay_gateway();
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let dead_expected = std::sync::atomic::AtomicBool::load(&self.dead_expected, Ordering::SeqCst);
        // Only on a database of its own (`on_database` apps may talk through a proxy running on the
        // test's runtime, which this blocking check would stall; their database's own app checks).
        if !dead_expected && !std::thread::panicking() && !self.db_name.is_empty() {
            let url = self.db_url.clone();
            let dead = beside_the_test(async move {
                    let mut c = AsyncPgConnection::establish(&url).await.ok()?;
                    diesel::sql_query(
                        "SELECT coalesce(string_agg(v, '; '), '') AS v FROM (
                           SELECT 'event ' || kind || ' ' || idempotency_key || ': ' || coalesce(last_error, '') AS v
                             FROM compensation_events WHERE status = 'DEAD'
                           UNION ALL
                           SELECT 'alert delivery ' || id || ' to ' || channel FROM alert_deliveries WHERE status = 'DEAD') d",
                    )
                    .get_result::<DeadText>(&mut c)
                    .await
                    .ok()
                    .map(|t| t.v)
            })
            .flatten()
            .unwrap_or_default();
            if !dead.is_empty() {
                self.drop_database();
                panic!("the test left DEAD work behind (call app.expect_dead() if it means to): {dead}");
            }
        }
        self.drop_database();
    }
}

/// Runs `work` to its end on a thread with a runtime of its own (`None` if it panicked): Drop
/// cannot await, and the test's runtime is going away.
fn beside_the_test<T: Send + 'static>(work: impl std::future::Future<Output = T> + Send + 'static) -> Option<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    })
    .join()
    .ok()
}

#[derive(diesel::QueryableByName)]
struct DeadText {
    #[diesel(sql_type = diesel::sql_types::Text)]
    v: String,
}

impl TestApp {
    /// This test leaves DEAD outbox events or alert deliveries behind on purpose.
    pub fn expect_dead(&self) {
        std::sync::atomic::AtomicBool::store(&self.dead_expected, true, Ordering::SeqCst);
    }

    fn drop_database(&self) {
        if self.db_name.is_empty() {
            return;
        }
        let admin = self.admin_url.clone();
        let name = self.db_name.clone();
        beside_the_test(async move {
            if let Ok(mut c) = AsyncPgConnection::establish(&admin).await {
                let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut c)
                    .await;
            }
        });
    }
}

impl TestApp {
    pub async fn new() -> TestApp {
        TestApp::with_config(|_| {}).await
    }

    pub async fn with_config(tweak: impl FnOnce(&mut Config)) -> TestApp {
        TestApp::build(tweak, None).await
    }

    /// An app served on a real port, its public URL that port (providers' notifications reach it).
    pub async fn served() -> TestApp {
        TestApp::served_with(|_| {}).await
    }

    pub async fn served_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        TestApp::build(tweak, Some(listener)).await
    }

    async fn build(tweak: impl FnOnce(&mut Config), listener: Option<tokio::net::TcpListener>) -> TestApp {
        let server = server().await;
        let name = format!(
            "fitorder_t_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = AsyncPgConnection::establish(&server.admin_url).await.unwrap();
        diesel::sql_query(format!("CREATE DATABASE {name} TEMPLATE {}", server.template))
            .execute(&mut conn)
            .await
            .unwrap();
        let db_url = with_db(&server.admin_url, &name);
        let mut config = Config::for_tests(db_url.clone());
        let sandbox = sandbox().await;
        point_at(&mut config, &sandbox);
        if let Some(l) = &listener {
            config.public_url = format!("http://{}", l.local_addr().unwrap());
        }
        // Tests share two cores: keep each app's pool modest.
        tweak(&mut config);
        // The production wiring: the state as `serve` builds it, served by its server loop.
        let state = fitorder::server::app_state(config, &db_url).unwrap();
        let router = fitorder::http::router(state.clone());
        if let Some(l) = listener {
            let r = router.clone();
            let limits = fitorder::http::ServeLimits::from_config(&state.config);
            tokio::spawn(async move { fitorder::http::serve_with(l, r, limits, std::future::pending::<()>()).await });
        }
        TestApp {
            sandbox,
            state,
            router,
            db_url,
            db_name: name,
            admin_url: server.admin_url.clone(),
            dead_expected: Default::default(),
        }
    }

    /// An app on a database the test made itself (not cloned, not dropped at the end).
    pub async fn on_database(url: &str, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let mut config = Config::for_tests(url.to_string());
        let sandbox = sandbox().await;
        point_at(&mut config, &sandbox);
        tweak(&mut config);
        let state = fitorder::server::app_state(config, url).unwrap();
        let router = fitorder::http::router(state.clone());
        TestApp {
            sandbox,
            state,
            router,
            db_url: url.to_string(),
            db_name: String::new(),
            admin_url: String::new(),
            dead_expected: Default::default(),
        }
    }

    /// [`TestApp::on_database`] served on a real port, its public URL that port (providers'
    /// notifications reach it).
    pub async fn served_on_database(url: &str, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let public_url = format!("http://{}", listener.local_addr().unwrap());
        let app = TestApp::on_database(url, |c| {
            c.public_url = public_url;
            tweak(c);
        })
        .await;
        let r = app.router.clone();
        let limits = fitorder::http::ServeLimits::from_config(&app.state.config);
        tokio::spawn(
            async move { fitorder::http::serve_with(listener, r, limits, std::future::pending::<()>()).await },
        );
        app
    }

    pub async fn conn(&self) -> DbConn {
        self.state.pool.get().await.unwrap()
    }

    pub fn token(&self, role: Role, sub: &str) -> String {
        issue_token(
            self.state.config.jwt_secret.expose_secret(),
            role,
            sub,
            None,
            std::time::Duration::from_secs(3600),
        )
    }

    pub fn admin_token(&self) -> String {
        self.token(Role::Admin, "staff-1")
    }

    pub fn ops_token(&self) -> String {
        self.token(Role::Ops, "ops-1")
    }

    pub fn member_token(&self, member_id: &str) -> String {
        self.token(Role::Member, member_id)
    }

    /// POSTs to the router and returns the status, headers and JSON body.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let mut req = Request::post(path).header("content-length", body.len().to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // As behind a load balancer on loopback (`providers::configure` trusts 127.0.0.1): the
        // peer is the proxy, the caller the address it reports.
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("x-forwarded-for")) {
            req = req.header("x-forwarded-for", TEST_CLIENT_IP);
        }
        req = req.extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            40_000,
        ))));
        let resp = self
            .router
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
        (status, headers, bytes)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Vec<u8>) {
        let resp = self
            .router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
    }

    /// GETs `/metrics` as Prometheus does outside development mode: from the
    /// FITORDER_METRICS_ADDR listener's router (the API port does not serve it there).
    pub async fn metrics(&self) -> (StatusCode, Vec<u8>) {
        let resp = fitorder::http::ops_router(self.state.clone())
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
    }

    /// Runs a GraphQL document and returns the whole response (`data` and `errors`).
    pub async fn gql(&self, token: Option<&str>, query: &str, variables: Value) -> Value {
        self.gql_named(token, query, None, variables).await
    }

    /// Runs one named operation of a client's document, as that client sends it.
    pub async fn op(&self, token: &str, doc: &str, name: &str, variables: Value) -> Value {
        self.gql_named(Some(token), doc, Some(name), variables).await
    }

    pub async fn gql_named(&self, token: Option<&str>, query: &str, op: Option<&str>, variables: Value) -> Value {
        let body = serde_json::to_vec(&json!({"query": query, "operationName": op, "variables": variables})).unwrap();
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let (status, _, bytes) = self.post("/graphql", &headers, body).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Runs a document that must succeed and returns its `data`.
    pub async fn ok(&self, token: &str, query: &str, variables: Value) -> Value {
        let r = self.gql(Some(token), query, variables).await;
        assert!(r.get("errors").is_none(), "unexpected errors: {r:#}");
        r["data"].clone()
    }

    /// Runs a document that must fail, and returns the first error's `extensions.code`.
    pub async fn err_code(&self, token: Option<&str>, query: &str, variables: Value) -> String {
        let r = self.gql(token, query, variables).await;
        error_code(&r)
    }

    pub async fn admin(&self, query: &str, variables: Value) -> Value {
        self.ok(&self.admin_token(), query, variables).await
    }

    /// A store with a member (wallet topped up with `money`), a 30-day plan, a 10-session pack
    /// with `stock`, and a coach slot with `seats`, through the admin console's operations.
    pub async fn studio(&self, money: i32, stock: Option<i32>, seats: i32) -> Studio {
        let code = format!("S{}", COUNTER.fetch_add(1, Ordering::SeqCst));
        let store = self
            .admin(
                "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
                json!({"i": {"name": "Test studio", "code": code}}),
            )
            .await["createStore"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let member = self.new_member(&store, money).await;
        let plan = self
            .admin(
                "mutation($i: CreateMembershipPlanInput!) { createMembershipPlan(input: $i) { id } }",
                json!({"i": {"storeId": store, "name": "Monthly", "durationDays": 30, "priceCents": 30000}}),
            )
            .await["createMembershipPlan"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let pack = self
            .admin(
                "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id } }",
                json!({"i": {"storeId": store, "name": "Ten", "sessions": 10, "priceCents": 10000, "stock": stock}}),
            )
            .await["createClassPack"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let starts = chrono::Utc::now() + chrono::Duration::days(1);
        let slot = self
            .admin(
                "mutation($i: CreateCoachSlotInput!) { createCoachSlot(input: $i) { id } }",
                json!({"i": {"storeId": store, "coachName": "Coach Liu", "startsAt": starts.to_rfc3339(),
                             "endsAt": (starts + chrono::Duration::hours(1)).to_rfc3339(), "capacity": seats, "priceCents": 30000}}),
            )
            .await["createCoachSlot"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        Studio {
            store,
            member,
            plan,
            pack,
            slot,
        }
    }

    pub async fn new_member(&self, store: &str, money: i32) -> String {
        let phone = format!("139{:08}", COUNTER.fetch_add(1, Ordering::SeqCst));
        let member = self
            .admin(
                "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }",
                json!({"i": {"storeId": store, "name": "Member", "phone": phone}}),
            )
            .await["createMember"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        if money > 0 {
            self.admin(
                "mutation($m: ID!, $a: Int!, $r: String!) { topUpWallet(memberId: $m, amountCents: $a, reference: $r) { id } }",
                json!({"m": member, "a": money, "r": format!("init-{member}")}),
            )
            .await;
        }
        member
    }

    /// Places an order as the member and returns the payload.
    pub async fn place(&self, member: &str, input: Value) -> Value {
        let r = self
            .op(
                &self.member_token(member),
                MEMBER_OPS,
                "PlaceOrder",
                json!({"input": input}),
            )
            .await;
        assert!(r.get("errors").is_none(), "placeOrder failed: {r:#}");
        r["data"]["placeOrder"].clone()
    }

    /// Places an order of `item` (e.g. `{"classPackId": "3"}`) with a fresh key; its number.
    pub async fn buy(&self, member: &str, store: &str, item: Value, method: &str) -> String {
        let placed = self
            .place(
                member,
                json!({"idempotencyKey": key(), "storeId": store, "item": item, "paymentMethod": method}),
            )
            .await;
        placed["order"]["orderNo"].as_str().unwrap().to_string()
    }

    pub async fn order(&self, order_no: &str) -> Value {
        self.admin(ORDER_CHAIN, json!({"orderNo": order_no})).await["order"].clone()
    }

    pub async fn member_view(&self, member: &str) -> Value {
        self.admin(MEMBER, json!({"id": member})).await["member"].clone()
    }

    /// Rows of a scalar SQL query, for invariants the API does not show.
    pub async fn sql_i64(&self, sql: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            v: i64,
        }
        let mut c = self.conn().await;
        let r: V = diesel::sql_query(sql).get_result(&mut c).await.unwrap();
        r.v
    }
}

pub struct Studio {
    pub store: String,
    pub member: String,
    pub plan: String,
    pub pack: String,
    pub slot: String,
}

/// Waits (at most `within`) until the `fitorder` process at `base` answers `/readyz` with 200.
pub async fn wait_ready(http: &reqwest::Client, base: &str, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

pub fn error_code(r: &Value) -> String {
    r["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error with a code, got {r:#}"))
        .to_string()
}

pub fn key() -> String {
    format!("k-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))
}

/// The clients' documents, exactly as the contract ships them (a test keeps the copies equal).
pub const MEMBER_OPS: &str = include_str!("../../playground/operations/member.graphql");
pub const ADMIN_OPS: &str = include_str!("../../playground/operations/admin.graphql");
pub const OPS_OPS: &str = include_str!("../../playground/operations/ops.graphql");

pub const ORDER_CHAIN: &str = "query($orderNo: String!) { order(orderNo: $orderNo) {
    orderNo kind status amountCents walletAmountCents paymentMethod sessionsTotal sessionsUsed
    expiresAt isExpired paidAt canceledAt cancelReason refundedAt refundAmountCents providerTxnId traceId
    allowedTransitions
    member { id wallet { balanceCents frozenCents } sessionCredits }
    timeline { at kind actor fromStatus toStatus summary traceId }
    compensation { id kind status attempts maxAttempts traceId }
    membership { id status validFrom validTo }
    tickets { id kind status }
} }";

pub const MEMBER: &str = "query($id: ID!) { member(id: $id) { id name phone sessionCredits
    wallet { balanceCents frozenCents } memberships { id status validFrom validTo order { orderNo } } } }";

pub const CHECK_IN: &str = "mutation($input: CheckInInput!) { checkIn(input: $input) {
    duplicate remainingSessions order { orderNo status sessionsUsed sessionsTotal } } }";

pub const CANCEL: &str =
    "mutation($orderNo: String!, $reason: String) { cancelOrder(orderNo: $orderNo, reason: $reason) {
    orderNo status cancelReason canceledAt } }";

pub const REFUND: &str = "mutation($orderNo: String!, $reason: String!, $amountCents: Int) {
    refundOrder(orderNo: $orderNo, reason: $reason, amountCents: $amountCents) {
    orderNo status refundedAt refundAmountCents compensation { id kind status } } }";

pub const CONFIRM_OFFLINE: &str = "mutation($orderNo: String!, $reference: String!) {
    confirmOfflinePayment(orderNo: $orderNo, reference: $reference) { orderNo status paidAt } }";

/// A free loopback port (free when asked: whoever binds it next gets it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `fitorder` binary under test, to be run: its arguments, its environment (the test's,
/// plus what is set here), stdin closed, stdout and stderr written to files in a directory of
/// its own (removed when the process or its result is dropped).
pub struct Fitorder {
    cmd: std::process::Command,
    dir: ProcDir,
    port: Option<u16>,
}

/// A process's directory under the system's temporary one, removed on drop.
struct ProcDir(std::path::PathBuf);

impl Drop for ProcDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Fitorder {
    /// `fitorder <args>`, run in the test's working directory.
    pub fn new(args: &[&str]) -> Fitorder {
        let dir = std::env::temp_dir().join(format!(
            "fitorder-proc-{}-{}-{}",
            args.first().copied().unwrap_or("none"),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fitorder"));
        cmd.args(args).stdin(std::process::Stdio::null());
        Fitorder {
            cmd,
            dir: ProcDir(dir),
            port: None,
        }
    }

    /// `fitorder serve` on a free loopback port (`FITORDER_ADDR`).
    pub fn serve() -> Fitorder {
        let port = free_port();
        let mut f = Fitorder::new(&["serve"]).env("FITORDER_ADDR", format!("127.0.0.1:{port}"));
        f.port = Some(port);
        f
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Fitorder {
        self.cmd.arg(arg);
        self
    }

    pub fn env(mut self, key: impl AsRef<std::ffi::OsStr>, value: impl AsRef<std::ffi::OsStr>) -> Fitorder {
        self.cmd.env(key, value);
        self
    }

    pub fn envs<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Fitorder
    where
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        self.cmd.envs(vars);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<std::ffi::OsStr>) -> Fitorder {
        self.cmd.env_remove(key);
        self
    }

    /// Runs in its own (empty) directory instead: no `.fitorder/` of a developer to fall back on.
    pub fn in_own_dir(mut self) -> Fitorder {
        self.cmd.current_dir(&self.dir.0);
        self
    }

    /// The port a [`Fitorder::serve`] will listen on.
    pub fn port(&self) -> u16 {
        self.port.expect("a fitorder serve")
    }

    fn start(mut self) -> (std::process::Child, ProcDir, Option<u16>) {
        let out = std::fs::File::create(self.dir.0.join("stdout.log")).unwrap();
        let err = std::fs::File::create(self.dir.0.join("stderr.log")).unwrap();
        let child = self.cmd.stdout(out).stderr(err).spawn().expect("start fitorder");
        (child, self.dir, self.port)
    }

    /// Starts it; it is killed when the answer is dropped (see [`Running::stop`]).
    pub fn spawn(self) -> Running {
        let (child, dir, port) = self.start();
        Running { child, dir, port }
    }

    /// Runs it to its end; `None` when it is still running after `within` (then it is killed).
    pub async fn output(self, within: std::time::Duration) -> Option<Finished> {
        let (mut child, dir, _) = self.start();
        let deadline = std::time::Instant::now() + within;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        Some(Finished {
            status,
            stdout: std::fs::read_to_string(dir.0.join("stdout.log")).unwrap_or_default(),
            stderr: std::fs::read_to_string(dir.0.join("stderr.log")).unwrap_or_default(),
            dir,
        })
    }
}

/// A `fitorder` run to its end.
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    dir: ProcDir,
}

impl Finished {
    /// The directory it ran with (its working directory after [`Fitorder::in_own_dir`]), there
    /// until this is dropped.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir.0
    }
}

/// A running `fitorder`, killed (SIGKILL) when dropped.
pub struct Running {
    child: std::process::Child,
    dir: ProcDir,
    port: Option<u16>,
}

impl Running {
    /// The port of a [`Fitorder::serve`].
    pub fn port(&self) -> u16 {
        self.port.expect("a fitorder serve")
    }

    /// `127.0.0.1:<port>` of a [`Fitorder::serve`].
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `http://127.0.0.1:<port>` of a [`Fitorder::serve`].
    pub fn base(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Whether it answers `/readyz` with 200 within `within` (see [`wait_ready`]).
    pub async fn ready(&self, http: &reqwest::Client, within: std::time::Duration) -> bool {
        wait_ready(http, &self.base(), within).await
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (not exited, not killed).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it wrote to stderr (its log) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("stderr.log")).unwrap_or_default()
    }

    /// Stops it as an orchestrator does (SIGTERM), waits for it to exit and answers its log.
    pub fn stop(mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        self.log()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process a test starts beside fitorder (a stand-in, an issuer), with its stdout read line
/// by line; killed when dropped (or by [`Helper::kill`]).
pub struct Helper {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Helper {
    /// Starts `cmd` with its stdout piped (the rest of its stdio as `cmd` says).
    pub fn start(cmd: &mut std::process::Command, what: &str) -> Helper {
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Helper { child, lines }
    }

    /// The next line it prints; `None` when it printed none within `within` or its stdout ended.
    pub fn line(&self, within: std::time::Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Its stdin, when `cmd` piped it (once).
    pub fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Kills it (if it still runs) and waits for it.
    pub fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.kill();
    }
}
