//! A real `nats-server` with JetStream on 127.0.0.1, started by a test: an ephemeral port,
//! its store in a temporary directory with explicit storage limits
//! (`kvroute_plane::local_server_config`: a nearly full disk does not refuse the stream),
//! stopped (`kill -9`) and started again on the same port and store, ended by its PID when
//! dropped.
//!
//! Where `nats-server` is not installed the tests that need it are skipped, unless
//! `KVROUTE_REQUIRE_NATS=1` (CI sets it): then its absence fails them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) server.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    binary: String,
}

/// The server binary: `nats-server` on the PATH or Debian's `/usr/sbin/nats-server`.
fn binary() -> Option<String> {
    let found = |p: &str| crate::runs(p.as_ref());
    ["nats-server", "/usr/sbin/nats-server"]
        .into_iter()
        .find(|p| found(p))
        .map(str::to_string)
}

impl NatsServer {
    /// Starts a server; None (with a note on stderr) when `nats-server` is not installed and
    /// not required.
    pub fn start() -> Option<Self> {
        let Some(binary) = binary() else {
            if std::env::var("KVROUTE_REQUIRE_NATS").is_ok_and(|v| v == "1") {
                panic!("nats-server is required (KVROUTE_REQUIRE_NATS=1) but not installed");
            }
            eprintln!("SKIPPED: nats-server is not installed (apt-get install nats-server)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut s = Self {
            child: None,
            port,
            dir: tempfile::tempdir().expect("a temporary directory"),
            binary,
        };
        s.restart();
        Some(s)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Ends the server at once (`kill -9`), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port and store, and waits until it accepts
    /// connections.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("a log file");
        let config = self.dir.path().join("server.conf");
        let text = kvroute_plane::local_server_config(self.port, &self.dir.path().join("store"));
        std::fs::write(&config, text).expect("writing the server's configuration");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nats-server did not listen on {} within 20 s: {}",
            self.port,
            self.log()
        );
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
