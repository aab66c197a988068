//! The platform certificates kept in the database (`wechat_platform_certs`), so every instance
//! verifies with the same set, and when they were last fetched (`wechat_platform_cert_refreshes`).

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::certificates::PlatformCert;
use crate::crypto::parse_certificate;
use crate::db::schema::{wechat_platform_cert_refreshes as refreshes, wechat_platform_certs as certs};

/// The `wechat_platform_cert_refreshes` row this store uses.
pub const REFRESH_SCOPE: &str = "wechat";

/// Upserts platform certificates by serial (`fetched_at` becomes now); returns how many.
pub async fn store(conn: &mut AsyncPgConnection, platform_certs: &[PlatformCert]) -> Result<usize> {
    if platform_certs.is_empty() {
        return Ok(0);
    }
    let rows: Vec<_> = platform_certs
        .iter()
        .map(|c| {
            (
                certs::serial_no.eq(c.serial_no.to_ascii_uppercase()),
                certs::pem.eq(&c.pem),
                certs::effective_at.eq(Some(c.effective_time)),
                certs::expire_at.eq(Some(c.expire_time)),
            )
        })
        .collect();
    let n = diesel::insert_into(certs::table)
        .values(rows)
        .on_conflict(certs::serial_no)
        .do_update()
        .set((
            certs::pem.eq(excluded(certs::pem)),
            certs::effective_at.eq(excluded(certs::effective_at)),
            certs::expire_at.eq(excluded(certs::expire_at)),
            certs::fetched_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await
        .context("storing the platform certificates")?;
    Ok(n)
}

/// The stored platform certificates that have not expired (unreadable rows are skipped, logged).
pub async fn load(conn: &mut AsyncPgConnection) -> Result<Vec<PlatformCert>> {
    type Row = (String, String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let rows: Vec<Row> = certs::table
        .filter(certs::expire_at.is_null().or(certs::expire_at.gt(diesel::dsl::now)))
        .select((certs::serial_no, certs::pem, certs::effective_at, certs::expire_at))
        .order(certs::serial_no)
        .load(conn)
        .await
        .context("loading the platform certificates")?;
    let now = Utc::now();
    let mut out = Vec::with_capacity(rows.len());
    for (serial_no, pem, effective_at, expire_at) in rows {
        let parsed = parse_certificate(pem.as_bytes()).and_then(|info| Ok((info.rsa_public_key()?, info)));
        let (public_key, info) = match parsed {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(serial_no, error = %e, "skipping an unreadable stored platform certificate");
                continue;
            }
        };
        let expire_time = expire_at.unwrap_or(info.not_after);
        if expire_time <= now {
            continue;
        }
        out.push(PlatformCert {
            serial_no,
            effective_time: effective_at.unwrap_or(info.not_before),
            expire_time,
            pem,
            public_key,
        });
    }
    Ok(out)
}

/// When the certificates were last fetched successfully, by any instance.
pub async fn last_success(conn: &mut AsyncPgConnection) -> Result<Option<DateTime<Utc>>> {
    let t: Option<Option<DateTime<Utc>>> = refreshes::table
        .find(REFRESH_SCOPE)
        .select(refreshes::last_success_at)
        .first(conn)
        .await
        .optional()
        .context("reading the last certificate refresh")?;
    Ok(t.flatten())
}
