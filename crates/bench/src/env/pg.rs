//! PostgreSQL: connections and the databases the bench makes next to the maintenance database.

use anyhow::{Context, Result};
use tokio_postgres::{Client, NoTls};

use super::DB_PREFIX;

/// Connects and drives the connection on the runtime; the client is all callers keep.
pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {}", fitorder::db::redact(url)))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The server named by BENCH_DATABASE_URL; databases are made next to its maintenance database.
pub struct Pg {
    pub base: String,
}

impl Pg {
    /// `base` with its database replaced by `db` (query parameters kept).
    pub fn url(&self, db: &str) -> String {
        let scheme_end = self.base.find("://").map(|i| i + 3).unwrap_or(0);
        let (head, query) = match self.base.find('?') {
            Some(q) => (&self.base[..q], &self.base[q..]),
            None => (&self.base[..], ""),
        };
        let host_end = head[scheme_end..]
            .find('/')
            .map(|i| scheme_end + i)
            .unwrap_or(head.len());
        format!("{}/{db}{query}", &head[..host_end])
    }

    pub async fn admin(&self) -> Result<Client> {
        connect(&self.base).await
    }

    /// Drops `name` if it exists (kicking out its sessions), then creates it, from `template`
    /// when given (a file-level copy: identical data, statistics included).
    pub async fn recreate(&self, name: &str, template: Option<&str>) -> Result<String> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        let sql = match template {
            Some(t) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{t}\""),
            None => format!("CREATE DATABASE \"{name}\""),
        };
        // A template still has a session for a moment after its last client let go (the
        // connection closes asynchronously): CREATE DATABASE … TEMPLATE is retried briefly.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match admin.batch_execute(&sql).await {
                Ok(()) => break,
                Err(e)
                    if template.is_some()
                        && e.as_db_error()
                            .is_some_and(|d| d.message().contains("being accessed by other users"))
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(anyhow::Error::new(e).context(sql.clone())),
            }
        }
        Ok(self.url(name))
    }

    pub async fn drop_db(&self, name: &str) -> Result<()> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        Ok(())
    }

    /// Drops what an earlier, interrupted run left behind: `fitorder_bench_<pid>_…` databases of
    /// a bench process that is gone (another run going on beside this one keeps its own), and
    /// the unnumbered ones of older versions of the bench when nobody is connected to them.
    pub async fn drop_leftovers(&self) -> Result<()> {
        let admin = self.admin().await?;
        let rows = admin
            .query(
                "SELECT datname, EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)
                   FROM pg_database d WHERE datname LIKE $1",
                &[&format!("{DB_PREFIX}%")],
            )
            .await?;
        for r in rows {
            let name: String = r.get(0);
            let in_use: bool = r.get(1);
            let owner = name[DB_PREFIX.len()..]
                .split('_')
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            let gone = match owner {
                Some(pid) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                None => !in_use,
            };
            if gone {
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await?;
            }
        }
        Ok(())
    }
}
