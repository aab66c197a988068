//! The outbox's enums as the schema shows them: mirrors of `domain::CompensationKind` and
//! `domain::CompensationStatus` (the domain knows nothing of GraphQL). The kinds are made from
//! the domain's list of effects, so a new effect is in the schema without being named here.

use async_graphql::Enum;

macro_rules! kind_mirror {
    ($($(#[doc = $doc:literal])* $variant:ident($payload:ty) = $kind:literal,)*) => {
        #[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
        #[graphql(remote = "crate::domain::CompensationKind")]
        pub enum CompensationKind {
            $(#[graphql(name = $kind)] $variant,)*
        }

        impl CompensationKind {
            pub fn as_str(self) -> &'static str {
                crate::domain::CompensationKind::from(self).as_str()
            }
        }
    };
}
crate::domain::effect::for_each_effect!(kind_mirror);

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::CompensationStatus")]
pub enum CompensationStatus {
    #[graphql(name = "PENDING")]
    Pending,
    #[graphql(name = "RETRYING")]
    Retrying,
    #[graphql(name = "SUCCEEDED")]
    Succeeded,
    #[graphql(name = "DEAD")]
    Dead,
}

impl CompensationStatus {
    pub fn as_str(self) -> &'static str {
        crate::domain::CompensationStatus::from(self).as_str()
    }
}
