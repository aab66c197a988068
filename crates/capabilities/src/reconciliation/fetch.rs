//! A run's bill: the file in the statement dir, or fetched through the provider's gateway and
//! unpacked (gzip, zip) into that name.

use std::path::PathBuf;

use chrono::NaiveDate;

use super::{bills, statement_path};
use crate::app::AppState;
use crate::domain::Provider;
use crate::error::{AppError, AppResult};
use crate::trace::TraceId;

/// Where a run's bill came from.
pub(super) enum Fetched {
    /// The bill, under the contract's name in the statement dir.
    Ready(PathBuf),
    /// The provider has not made it yet (its words).
    NotMade(String),
    /// The provider has no bill of that day because nothing happened (its words).
    NoBill(String),
}

/// The bill of `provider` for `date`: the file in the statement dir when it is there (put by
/// staff, or fetched before), else fetched through the provider's gateway and unpacked into
/// that name. Errors say what staff can do.
pub(super) async fn bill_file(
    state: &AppState,
    provider: Provider,
    date: NaiveDate,
    trace: &TraceId,
) -> AppResult<Fetched> {
    let dir = &state.config.statement_dir;
    let path = statement_path(dir, provider, date);
    if path.exists() {
        return Ok(Fetched::Ready(path));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(gateway) = state.providers.gateway(provider) else {
        return Err(AppError::bad(format!(
            "no bill {name} in the statement directory, and {provider} is not configured to fetch it: \
             download the bill from the merchant platform into the statement directory as {name}, then run the \
             reconciliation again"
        )));
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        AppError::internal(format!(
            "the statement directory cannot be created ({}): check FITORDER_STATEMENT_DIR",
            e.kind()
        ))
    })?;
    let fetched = gateway.fetch_bill(date, dir, trace.as_str()).await.map_err(|e| {
        use crate::providers::provider::ProviderError as E;
        let what = match &e {
            E::Unreachable(_) => {
                "the provider did not answer; it is asked again at the next run (or run the \
                                  reconciliation again once it answers)"
            }
            E::Unsigned(_) => {
                "the bill answer is not signed by the provider's key: check the configured platform \
                               public key / certificate; nothing was reconciled"
            }
            E::Refused(_) | E::TradeTaken(_) => {
                "check the merchant account's bill permission and the provider \
                                                 configuration, or download the bill from the merchant platform"
            }
            E::Unsupported(_) => "this provider cannot be fetched: download the bill from the merchant platform",
            E::UnsignedError(_) => {
                "the provider refused the request with the error above (it did not sign it, so nothing was \
                 taken from it): check the merchant configuration it names (keys, serial, app id)"
            }
        };
        AppError::bad(format!(
            "fetching the {provider} bill of {date} failed: {e}. {what} (into {name})"
        ))
    })?;
    let (archive, sha1) = match fetched {
        crate::providers::provider::BillDownload::NotReady(why) => return Ok(Fetched::NotMade(why)),
        crate::providers::provider::BillDownload::NoBill(why) => return Ok(Fetched::NoBill(why)),
        crate::providers::provider::BillDownload::Downloaded { archive, sha1 } => (archive, sha1),
    };
    let dest = path.clone();
    let unpacked = tokio::task::spawn_blocking({
        let archive = archive.clone();
        let plugin = crate::providers::provider::plugin(provider);
        move || plugin.unpack_bill(&archive, sha1.as_deref(), &dest)
    })
    .await
    .map_err(|e| AppError::internal(format!("unpacking the bill crashed: {e}")))?;
    let _ = std::fs::remove_file(&archive);
    let done = unpacked.map_err(|e| {
        let what = match &e {
            bills::ArchiveError::Sha1Mismatch { .. } => {
                "the download is damaged or not the bill the provider signed; nothing was reconciled — run the \
                 reconciliation again to download it anew, and ask the provider if it repeats"
            }
            bills::ArchiveError::Io(_) => "check the statement directory's free space and permissions, then run again",
            _ => {
                "the download is not a bill archive; run the reconciliation again, or download the bill from the \
                  merchant platform"
            }
        };
        AppError::bad(format!(
            "the fetched {provider} bill of {date} was refused: {e}. {what} (into {name})"
        ))
    })?;
    tracing::info!(%provider, %date, bytes = done.bytes, sha1 = %done.sha1, "bill fetched");
    Ok(Fetched::Ready(path))
}
