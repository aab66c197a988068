//! What every handler shares: the pool and the configuration.

use std::sync::Arc;

use crate::config::Config;
use crate::db::DbPool;
use crate::events::EventHub;
use crate::payments::keys::ProviderKeys;

#[derive(Clone)]
pub struct AppState {
    pub pool: DbPool,
    pub config: Arc<Config>,
    pub keys: Arc<ProviderKeys>,
    pub events: EventHub,
}

impl AppState {
    /// State without provider keys (their callbacks answer 503) and without live events.
    pub fn new(pool: DbPool, config: Config) -> AppState {
        AppState::with_keys(pool, config, ProviderKeys::default(), EventHub::detached())
    }

    pub fn with_keys(
        pool: DbPool,
        config: Config,
        keys: ProviderKeys,
        events: EventHub,
    ) -> AppState {
        AppState {
            pool,
            config: Arc::new(config),
            keys: Arc::new(keys),
            events,
        }
    }
}
