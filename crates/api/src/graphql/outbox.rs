//! The outbox's enums as the schema shows them: mirrors of `domain::CompensationKind` and
//! `domain::CompensationStatus` (the domain knows nothing of GraphQL). The kinds are made from
//! the domain's list of effects, so a new effect is in the schema without being named here.

use async_graphql::Enum;

macro_rules! kind_mirror {
    (
        [$($(#[doc = $doc:literal])* $variant:ident($payload:ty) = $kind:literal,)*]
        [$($(#[doc = $hdoc:literal])* $hidden:ident($hpayload:ty) = $hkind:literal,)*]
    ) => {
        /// The effects of an order (those of no order, such as alert deliveries, are not shown).
        #[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
        pub enum CompensationKind {
            $(#[graphql(name = $kind)] $variant,)*
        }

        impl From<CompensationKind> for crate::domain::CompensationKind {
            fn from(k: CompensationKind) -> Self {
                match k {
                    $(CompensationKind::$variant => crate::domain::CompensationKind::$variant,)*
                }
            }
        }

        impl CompensationKind {
            /// The kind texts of the effects the API shows.
            pub const SHOWN: &'static [&'static str] = &[$($kind,)*];

            pub fn as_str(self) -> &'static str {
                crate::domain::CompensationKind::from(self).as_str()
            }

            /// The kind as the API shows it; `None` for an effect it does not show.
            pub fn shown(k: crate::domain::CompensationKind) -> Option<CompensationKind> {
                match k {
                    $(crate::domain::CompensationKind::$variant => Some(CompensationKind::$variant),)*
                    $(crate::domain::CompensationKind::$hidden => None,)*
                }
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
