//! What every handler shares: the pool and the configuration.

use std::sync::Arc;

use crate::config::Config;
use crate::db::DbPool;

#[derive(Clone)]
pub struct AppState {
    pub pool: DbPool,
    pub config: Arc<Config>,
}

impl AppState {
    pub fn new(pool: DbPool, config: Config) -> AppState {
        AppState {
            pool,
            config: Arc::new(config),
        }
    }
}
