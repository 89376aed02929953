//! A `kvroute` server process on 127.0.0.1 for the CLI's integration tests: started with its
//! output read on a thread, the values it prints, signals, a clean stop. (Shared by several
//! test binaries, each using part of it.)
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A server process and the lines it printed, read on a thread.
pub struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kvroute");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The text after `prefix` on the first line holding it (within 30 s).
    pub fn value_after(&self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no line with {prefix:?}"));
            if let Some(i) = line.find(prefix) {
                return line[i + prefix.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
        }
    }

    /// The first line holding `prefix` (within 30 s), whole.
    pub fn line_with(&self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no line with {prefix:?}"));
            if line.contains(prefix) {
                return line;
            }
        }
    }

    /// Sends SIGINT and returns whether it exited successfully within 20 s.
    pub fn interrupt(mut self) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        false
    }
}

impl Server {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`...) with `kill(1)`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Kills the process (SIGKILL) and waits for it to be gone.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kvroute worker` named `name` (20x real time) publishing its KV events over ZMQ with a
/// replay service: the process and its `--worker` spec `URL=EVENTS=REPLAY`.
pub fn zmq_worker(name: &str) -> (Server, String) {
    let w = Server::start(&[
        "worker",
        "--port",
        "0",
        "--name",
        name,
        "--speedup",
        "20",
        "--zmq-publish",
        "tcp://127.0.0.1:0",
        "--zmq-replay",
        "tcp://127.0.0.1:0",
    ]);
    let url = w.value_after("kvroute worker on ");
    let events = w.value_after("KV events: ");
    let replay = w.value_after("replay:    ");
    (w, format!("{url}={events}={replay}"))
}
