//! What a sign-in answers.

use async_graphql::{Context, Object};
use chrono::{DateTime, Utc};

use super::super::loaders::load_member_now;
use super::MemberNode;
use crate::graphql::error::{GqlResult, IntoGqlResult};
use crate::sessions;

pub struct SessionNode(pub sessions::Session);

/// what a sign-in answers: a short-lived access token (the Bearer JWT) and a one-use refresh token
#[Object(name = "Session")]
impl SessionNode {
    async fn access_token(&self) -> &str {
        &self.0.access_token
    }
    async fn access_token_expires_at(&self) -> DateTime<Utc> {
        self.0.access_token_expires_at
    }
    async fn refresh_token(&self) -> &str {
        &self.0.refresh_token
    }
    async fn refresh_token_expires_at(&self) -> DateTime<Utc> {
        self.0.refresh_token_expires_at
    }
    /// true when this sign-in made the member
    async fn new_member(&self) -> bool {
        self.0.new_member
    }
    async fn member(&self, ctx: &Context<'_>) -> GqlResult<MemberNode> {
        let with_store = ctx.look_ahead().field("store").exists();
        load_member_now(ctx, self.0.member_id, with_store).await.gql()
    }
}
