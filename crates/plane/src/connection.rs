//! The event plane's NATS connection (made by [`crate::connect`]): the client, and whether
//! it is connected now.

use tokio::sync::watch;

/// A connection to the plane and whether it is up now.
#[derive(Clone, Debug)]
pub struct Connection {
    /// The client.
    pub client: async_nats::Client,
    /// True while connected.
    pub up: watch::Receiver<bool>,
}
