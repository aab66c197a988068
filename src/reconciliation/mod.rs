//! Reconciliation against the providers' daily bills.

pub mod bills;

use crate::tasks::Task;

/// The scheduler's reconciliation tasks.
pub fn scheduled_tasks() -> Vec<Task> {
    vec![]
}
