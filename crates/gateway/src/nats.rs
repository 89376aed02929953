//! The event plane's NATS connection as the gateway holds it (made by the plane's `connect`):
//! the client, and whether it is connected now. A value below the plane's tasks so that the
//! gateway's state can hold it without knowing them.

use tokio::sync::watch;

/// A connection to the plane and whether it is up now.
#[derive(Clone, Debug)]
pub struct Connection {
    /// The client.
    pub client: async_nats::Client,
    /// True while connected.
    pub up: watch::Receiver<bool>,
}
