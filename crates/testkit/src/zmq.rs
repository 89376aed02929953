//! ZMQ sockets for tests (libzmq through the `zmq` crate, as the gateway and the worker use
//! it): a publisher that plays an engine, a subscriber, and a replay request. Blocking calls
//! run on tokio's blocking pool, bounded by timeouts, so a test's runtime keeps serving.

pub mod raw;

use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
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

/// A free port of 127.0.0.1 below Linux's ephemeral range (32768 and up), for an endpoint a
/// test binds again after closing it, or that is connected to before anything listens
/// there: a connection to a free port of the ephemeral range can be given that very port as
/// its own source and connect to itself.
pub fn free_low_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let spread = (std::process::id() % 4000) as u16;
    loop {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (spread + k.wrapping_mul(7)) % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Binds `socket` to `endpoint`. An engine restarting on the same port may find it still
/// held for a moment by the socket it closed (ZMQ closes sockets on its own I/O thread):
/// tried again for up to 5 s.
fn bind(socket: &zmq::Socket, endpoint: &str, kind: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match socket.bind(endpoint) {
            Ok(()) => return,
            Err(zmq::Error::EADDRINUSE) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("bind {kind} to {endpoint}: {e}"),
        }
    }
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
        bind(&socket, endpoint, "PUB");
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
        self.socket
            .lock()
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
            let socket = socket.lock();
            let ready = socket
                .poll(zmq::POLLIN, timeout.as_millis() as i64)
                .expect("poll");
            let message = (ready > 0).then(|| socket.recv_multipart(0).expect("recv"));
            drop(socket);
            message
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

/// Held batches: (sequence number, payload).
type History = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A ROUTER socket playing an engine's replay service (vLLM 0.32's protocol): answers
/// `["", start]` with `["", topic, seq, payload]` for each held batch from `start` on, then
/// `["", "", 0xFF x 8, ""]`. Runs on a thread of its own until dropped.
pub struct ReplayServer {
    /// Where it is bound (port resolved).
    pub endpoint: String,
    history: History,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReplayServer {
    /// Bound to `endpoint` (e.g. `tcp://127.0.0.1:0`), holding nothing yet.
    pub fn bind(endpoint: &str) -> Self {
        let socket = context().socket(zmq::ROUTER).expect("ROUTER socket");
        socket.set_linger(0).expect("linger");
        bind(&socket, endpoint, "ROUTER");
        let endpoint = endpoint_of(&socket);
        let history: History = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (history.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if socket.poll(zmq::POLLIN, 50).expect("poll") == 0 {
                    continue;
                }
                let req = socket.recv_multipart(0).expect("recv");
                let [client, _, start] = req.as_slice() else {
                    continue;
                };
                let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let held: Vec<(u64, Vec<u8>)> = h
                    .lock()
                    .iter()
                    .filter(|(seq, _)| *seq >= start)
                    .cloned()
                    .collect();
                for (seq, payload) in held {
                    let m: [&[u8]; 5] = [client, b"", b"", &seq.to_be_bytes(), &payload];
                    socket.send_multipart(m, 0).expect("send");
                }
                let end: [&[u8]; 5] = [client, b"", b"", &[0xFF; 8], b""];
                socket.send_multipart(end, 0).expect("send");
            }
        });
        Self {
            endpoint,
            history,
            stop,
            thread: Some(thread),
        }
    }

    /// Holds batch `seq` with `payload` from now on.
    pub fn hold(&self, seq: u64, payload: Vec<u8>) {
        self.history.lock().push((seq, payload));
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
