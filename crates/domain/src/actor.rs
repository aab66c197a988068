//! Who acts, and under which trace id: the two things every write records.

use std::fmt;

use super::payment::Provider;
use super::vocabulary::vocabulary;

vocabulary! {
    /// Who asks for a change. Members act on their own orders, staff from the admin console, ops
    /// from the ops screen, providers through signed callbacks, and the system from background
    /// tasks. The text is the prefix of an [`Actor`] in the audit trail (`member:42`).
    pub enum ActorKind {
        Member = "member",
        Admin = "admin",
        Ops = "ops",
        Provider = "provider",
        System = "system",
    }
}

/// The actor of a change, as recorded in the audit trail (`member:42`, `admin:staff-7`,
/// `provider:WECHAT_PAY`, `system:expiry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub kind: ActorKind,
    pub id: String,
}

impl Actor {
    pub fn member(id: i64) -> Actor {
        Actor {
            kind: ActorKind::Member,
            id: id.to_string(),
        }
    }
    pub fn admin(id: impl Into<String>) -> Actor {
        Actor {
            kind: ActorKind::Admin,
            id: id.into(),
        }
    }
    pub fn ops(id: impl Into<String>) -> Actor {
        Actor {
            kind: ActorKind::Ops,
            id: id.into(),
        }
    }
    pub fn provider(provider: Provider) -> Actor {
        Actor {
            kind: ActorKind::Provider,
            id: provider.as_str().to_string(),
        }
    }
    pub fn system(task: &str) -> Actor {
        Actor {
            kind: ActorKind::System,
            id: task.to_string(),
        }
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.id)
    }
}

/// One trace id through the whole chain, written on every row a request writes. Made up or
/// taken from the caller's headers by [`crate::trace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceId(pub String);

impl TraceId {
    /// A new random id (16 bytes, lowercase hex: a W3C trace id).
    pub fn new() -> TraceId {
        use rand::Rng;
        let bytes: [u8; 16] = rand::rng().random();
        TraceId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TraceId {
    fn default() -> Self {
        TraceId::new()
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who is acting and under which trace id: passed to everything that writes.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub actor: Actor,
    pub trace: TraceId,
}
