//! Reports for finance: `GET /reports/prepaid.csv?storeId=…&from=…&to=…`, the prepaid ledger
//! (预收资金台账) of a store as a CSV that opens in Excel (UTF-8 with a BOM, Chinese headers),
//! for a staff Bearer token (admin or ops, of that store).

use crate::config::ExposeSecret;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::NaiveDate;

use super::HttpState;
use crate::auth::Role;
use crate::error::AppError;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrepaidQuery {
    store_id: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

/// The CSV's columns: 日期 (date), 收取 (collected), 消耗确认 (earned by use), 退款 (refunded out),
/// 余额 (balance), amounts in yuan with two decimals.
const HEADERS: [&str; 5] = ["日期", "预收收取(元)", "消耗确认(元)", "退款(元)", "预收余额(元)"];

fn refused(status: StatusCode, e: &AppError) -> Response {
    let body = serde_json::json!({"errors": [{"message": e.public_message(), "extensions": {"code": e.code()}}]});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn date(v: Option<&str>, what: &str) -> Result<NaiveDate, AppError> {
    v.and_then(|s| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok())
        .ok_or_else(|| AppError::bad(format!("{what} must be a date YYYY-MM-DD")))
}

pub async fn prepaid_csv(State(s): State<HttpState>, headers: HeaderMap, Query(q): Query<PrepaidQuery>) -> Response {
    let auth = headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
    let Some(auth) = auth else {
        return refused(
            StatusCode::UNAUTHORIZED,
            &AppError::Unauthenticated("a bearer token is required".into()),
        );
    };
    let viewer =
        match crate::auth::verify_bearer(s.app.config.jwt_secret.expose_secret(), s.app.oidc.as_deref(), auth).await {
            Ok((v, _)) => v,
            Err(e) => return refused(StatusCode::UNAUTHORIZED, &e),
        };
    if let Err(e) = viewer.require(&[Role::Admin, Role::Ops]) {
        return refused(StatusCode::FORBIDDEN, &e);
    }
    let input = (|| {
        let store = q
            .store_id
            .as_deref()
            .and_then(crate::auth::canonical_id)
            .ok_or_else(|| AppError::bad("storeId must be a store's id"))?;
        Ok::<_, AppError>((store, date(q.from.as_deref(), "from")?, date(q.to.as_deref(), "to")?))
    })();
    let (store, from, to) = match input {
        Ok(i) => i,
        Err(e) => return refused(StatusCode::BAD_REQUEST, &e),
    };
    if let Err(e) = viewer.require_store(store) {
        return refused(StatusCode::FORBIDDEN, &e);
    }
    let rows = async {
        let mut c = s.app.pool.get().await?;
        crate::catalog::require_store(&mut c, store).await?;
        crate::prepaid::ledger::ledger(&mut c, store, from, to, s.app.config.timezone).await
    }
    .await;
    let rows = match rows {
        Ok(r) => r,
        Err(e @ AppError::NotFound(_)) => return refused(StatusCode::NOT_FOUND, &e),
        Err(e @ (AppError::BadInput(_) | AppError::Refused { .. })) => return refused(StatusCode::BAD_REQUEST, &e),
        Err(e) => {
            tracing::error!(error = %e.message(), "prepaid ledger report");
            return refused(StatusCode::INTERNAL_SERVER_ERROR, &e);
        }
    };
    let mut out = csv::Writer::from_writer(vec![0xEF, 0xBB, 0xBF]);
    let yuan = crate::domain::money::format_yuan;
    let written = (|| -> Result<Vec<u8>, csv::Error> {
        out.write_record(HEADERS)?;
        for r in &rows {
            out.write_record([
                r.date.to_string(),
                yuan(r.collected_cents),
                yuan(r.earned_cents),
                yuan(r.refunded_cents),
                yuan(r.balance_cents),
            ])?;
        }
        out.into_inner().map_err(|e| e.into_error().into())
    })();
    match written {
        Ok(bytes) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"prepaid-{store}-{from}-{to}.csv\""),
                ),
                (header::CACHE_CONTROL, "no-store".to_string()),
            ],
            bytes,
        )
            .into_response(),
        Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, &AppError::internal(e)),
    }
}
