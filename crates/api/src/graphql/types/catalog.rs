//! What a store sells.

use async_graphql::{Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::super::int;
use crate::db::models;
use crate::graphql::error::{GqlResult, IntoGqlResult};

pub struct MembershipPlanNode(pub models::MembershipPlan);

#[Object(name = "MembershipPlan")]
impl MembershipPlanNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn duration_days(&self) -> i32 {
        self.0.duration_days
    }
    async fn price_cents(&self) -> GqlResult<i32> {
        int(self.0.price_cents).gql()
    }
    /// frozen days a card of this plan may have over its life
    async fn max_freeze_days(&self) -> i32 {
        self.0.max_freeze_days
    }
    /// freezes a card of this plan may have
    async fn max_freezes(&self) -> i32 {
        self.0.max_freezes
    }
    /// sold no more; kept on the orders that bought it
    async fn retired(&self) -> bool {
        self.0.retired_at.is_some()
    }
}

pub struct ClassPackNode(pub models::ClassPack);

#[Object(name = "ClassPack")]
impl ClassPackNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn sessions(&self) -> i32 {
        self.0.sessions
    }
    async fn price_cents(&self) -> GqlResult<i32> {
        int(self.0.price_cents).gql()
    }
    /// null: unlimited
    async fn remaining_stock(&self) -> Option<i32> {
        self.0.stock
    }
    /// sold no more; kept on the orders that bought it
    async fn retired(&self) -> bool {
        self.0.retired_at.is_some()
    }
}

pub struct CoachSlotNode(pub models::CoachSlot);

#[Object(name = "CoachSlot")]
impl CoachSlotNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn coach_name(&self) -> &str {
        &self.0.coach_name
    }
    async fn starts_at(&self) -> DateTime<Utc> {
        self.0.starts_at
    }
    async fn ends_at(&self) -> DateTime<Utc> {
        self.0.ends_at
    }
    async fn capacity(&self) -> i32 {
        self.0.capacity
    }
    async fn remaining(&self) -> i32 {
        self.0.remaining
    }
    async fn price_cents(&self) -> GqlResult<i32> {
        int(self.0.price_cents).gql()
    }
    /// when the session was canceled (`cancelCoachSlot`); null while it is on
    async fn canceled_at(&self) -> Option<DateTime<Utc>> {
        self.0.canceled_at
    }
    async fn cancel_reason(&self) -> Option<&str> {
        self.0.cancel_reason.as_deref()
    }
}

#[derive(SimpleObject)]
#[graphql(name = "Catalog")]
pub struct CatalogNode {
    pub membership_plans: Vec<MembershipPlanNode>,
    pub class_packs: Vec<ClassPackNode>,
    pub coach_slots: Vec<CoachSlotNode>,
    /// null when the store asks for none
    pub terms: Option<super::TermsNode>,
}
