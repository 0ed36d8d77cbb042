//! How a handler calls the engine: one service operation, on the blocking pool (SQLite, tantivy and ONNX are
//! synchronous), as the request's caller. Handlers hold no logic of their own beyond parsing and rendering.

use actix_web::web;
use care_engine::{Actor, Admin, Engine};

use crate::AppState;
use crate::errors::ApiError;
use crate::guard::Caller;

/// Runs `op` as `caller` off the async workers and flattens its errors.
pub async fn call<T: Send + 'static>(
    state: &web::Data<AppState>,
    caller: &Caller,
    op: impl FnOnce(&Engine, &Actor) -> care_engine::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let actor = caller.actor();
    anon(state, move |e| op(e, &actor)).await
}

/// Runs admin-only `op` as `caller`, proven an administrator first (the guard admits only administrators to
/// these routes; the proof makes the engine's signature say so too).
pub async fn call_admin<T: Send + 'static>(
    state: &web::Data<AppState>,
    caller: &Caller,
    op: impl FnOnce(&Engine, &Admin) -> care_engine::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let admin = caller.actor().admin()?;
    anon(state, move |e| op(e, &admin)).await
}

/// The same for requests before anyone is signed in (login, session lookup, health).
pub async fn anon<T: Send + 'static>(
    state: &web::Data<AppState>,
    op: impl FnOnce(&Engine) -> care_engine::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let engine = state.engine.clone();
    web::block(move || op(&engine)).await.map_err(ApiError::internal)?.map_err(ApiError::from)
}
