//! What kvroute's live processes (the gateway, the worker, the dashboard) share beyond wire
//! formats: the HTTP server loop (hyper under axum: WebSocket upgrades, deadlines, a
//! connection cap, graceful shutdown; `serve.rs`), access control (`access.rs`), TLS
//! (`tls.rs`) and the live clock, on tokio's time so that tests run on paused time
//! (`clock.rs`). Refusals are the OpenAI API's error objects (`kvroute_protocol::openai`).

pub mod access;
mod clock;
mod serve;
mod tls;

pub use access::{require, Access, AccessPolicy, Secret};
pub use clock::Clock;
pub use serve::{serve, ServeLimits, BODY_READ_TIMEOUT, MAX_CONNECTIONS, OVERFLOW_CONNECTIONS};
pub use tls::{Tls, TlsError};
