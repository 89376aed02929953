//! ZMQ sockets for tests (libzmq through the `zmq` crate, as the gateway and the worker use
//! it): a publisher that plays an engine, a subscriber, and a replay request. Blocking calls
//! run on tokio's blocking pool, bounded by timeouts, so a test's runtime keeps serving.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

fn context() -> &'static zmq::Context {
    static CTX: OnceLock<zmq::Context> = OnceLock::new();
    CTX.get_or_init(zmq::Context::new)
}

fn endpoint_of(socket: &zmq::Socket) -> String {
    socket
        .get_last_endpoint()
        .expect("last endpoint")
        .expect("utf-8 endpoint")
}

/// A PUB socket playing an engine's KV event publisher.
pub struct Publisher {
    socket: Mutex<zmq::Socket>,
    /// Where it is bound (port resolved), or what it connected to.
    pub endpoint: String,
}

impl Publisher {
    /// Bound to `endpoint` (e.g. `tcp://127.0.0.1:0`).
    pub fn bind(endpoint: &str) -> Self {
        let socket = context().socket(zmq::PUB).expect("PUB socket");
        socket.set_linger(0).expect("linger");
        socket.bind(endpoint).expect("bind PUB");
        Self {
            endpoint: endpoint_of(&socket),
            socket: Mutex::new(socket),
        }
    }

    /// Connected to `endpoint` (a gateway that binds its SUB socket there).
    pub fn connect(endpoint: &str) -> Self {
        let socket = context().socket(zmq::PUB).expect("PUB socket");
        socket.set_linger(0).expect("linger");
        socket.connect(endpoint).expect("connect PUB");
        Self {
            endpoint: endpoint.to_string(),
            socket: Mutex::new(socket),
        }
    }

    /// Publishes one message (never blocks: a PUB socket drops past its high-water mark).
    pub fn send(&self, frames: &[Vec<u8>]) {
        let socket = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        socket
            .send_multipart(frames, zmq::DONTWAIT)
            .expect("publish");
    }
}

/// A SUB socket subscribed to everything.
pub struct Subscriber {
    socket: Arc<Mutex<zmq::Socket>>,
}

impl Subscriber {
    /// Connected to `endpoint`.
    pub fn connect(endpoint: &str) -> Self {
        let socket = context().socket(zmq::SUB).expect("SUB socket");
        socket.set_linger(0).expect("linger");
        socket.set_subscribe(b"").expect("subscribe");
        socket.connect(endpoint).expect("connect SUB");
        Self {
            socket: Arc::new(Mutex::new(socket)),
        }
    }

    /// The next message, or None after `timeout`.
    pub async fn recv(&self, timeout: Duration) -> Option<Vec<Vec<u8>>> {
        let socket = self.socket.clone();
        tokio::task::spawn_blocking(move || {
            let socket = socket.lock().unwrap_or_else(|p| p.into_inner());
            let ready = socket
                .poll(zmq::POLLIN, timeout.as_millis() as i64)
                .expect("poll");
            (ready > 0).then(|| socket.recv_multipart(0).expect("recv"))
        })
        .await
        .expect("blocking task")
    }
}

/// Sends a replay request `["", start]` to a ROUTER at `endpoint` from a DEALER, and returns
/// every message of the answer as received (frames), the end marker's included: the answer
/// ends at a message whose sequence frame (the one before last) is `0xFF` x 8. Panics after
/// `timeout`.
pub async fn replay_raw(endpoint: &str, start: u64, timeout: Duration) -> Vec<Vec<Vec<u8>>> {
    let endpoint = endpoint.to_string();
    tokio::task::spawn_blocking(move || {
        let dealer = context().socket(zmq::DEALER).expect("DEALER socket");
        dealer.set_linger(0).expect("linger");
        dealer.connect(&endpoint).expect("connect DEALER");
        let request: [&[u8]; 2] = [b"", &start.to_be_bytes()];
        dealer.send_multipart(request, 0).expect("send request");
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                dealer
                    .poll(zmq::POLLIN, left.as_millis() as i64)
                    .expect("poll")
                    > 0,
                "no end of the replay answer within {timeout:?} ({} messages)",
                got.len()
            );
            let m = dealer.recv_multipart(0).expect("recv");
            let end = m.len() >= 2 && m[m.len() - 2] == [0xFF; 8];
            got.push(m);
            if end {
                return got;
            }
        }
    })
    .await
    .expect("blocking task")
}
