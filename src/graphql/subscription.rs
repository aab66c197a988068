//! Subscriptions for the ops screen and the member app.

use async_graphql::{Context, Subscription, ID};
use futures_util::stream::{self, BoxStream, StreamExt};

use super::types::{ExceptionTicketNode, OrderStatusChange};
use super::viewer;
use crate::compensation::CompensationStatus;
use crate::error::{AppError, AppResult};
use crate::graphql::types::CompensationEventNode;

pub struct Subscription;

fn not_built<T: Send + 'static>() -> BoxStream<'static, AppResult<T>> {
    stream::once(async {
        Err(AppError::NotBuilt(
            "live subscriptions (the compensation work)",
        ))
    })
    .boxed()
}

#[Subscription]
impl Subscription {
    async fn compensation_updates(
        &self,
        ctx: &Context<'_>,
        order_no: Option<String>,
        status: Option<Vec<CompensationStatus>>,
    ) -> async_graphql::Result<BoxStream<'static, AppResult<CompensationEventNode>>> {
        viewer(ctx)?;
        let _ = (order_no, status);
        Ok(not_built())
    }

    async fn order_status_changed(
        &self,
        ctx: &Context<'_>,
        order_no: Option<String>,
        store_id: Option<ID>,
    ) -> async_graphql::Result<BoxStream<'static, AppResult<OrderStatusChange>>> {
        viewer(ctx)?;
        let _ = (order_no, store_id);
        Ok(not_built())
    }

    async fn ticket_opened(
        &self,
        ctx: &Context<'_>,
        store_id: Option<ID>,
    ) -> async_graphql::Result<BoxStream<'static, AppResult<ExceptionTicketNode>>> {
        viewer(ctx)?;
        let _ = store_id;
        Ok(not_built())
    }
}
