//! `[plane]`: how to reach the NATS event plane, its stream's limits, its subjects
//! (the plane crate, `kvroute_plane`).

use kvroute_protocol::plane::subject_token;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How to reach the event plane and the stream's limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlaneConfig {
    /// The NATS server(s), e.g. `nats://127.0.0.1:4222` (several separated by commas).
    pub url: String,
    /// The JetStream stream holding every worker's events (created when missing).
    pub stream: String,
    /// The first token of every subject (`PREFIX.kv.WORKER`, `PREFIX.replay.WORKER`).
    pub prefix: String,
    /// Seconds a message stays in the stream.
    pub max_age_secs: f64,
    /// The stream's size limit in bytes (the oldest messages leave first).
    pub max_bytes: i64,
    /// Messages kept per worker subject (the oldest leave first).
    pub max_messages_per_worker: i64,
    /// Seconds within which a message published twice with the same dedup id is stored once.
    pub duplicate_window_secs: f64,
    /// Largest replay answer page in bytes (NATS's default message limit is 1 MiB).
    pub replay_page_bytes: usize,
    /// Most pages one replay may take (a bound on what a gap fill reads).
    pub replay_max_pages: usize,
    /// Seconds to wait for one answer (a replay page, a stream call).
    pub request_timeout_secs: f64,
    /// Share bookings with the other gateway replicas and count theirs.
    pub share_load: bool,
    /// Seconds between a replica's listings of its requests in flight (its heartbeat).
    pub load_heartbeat_secs: f64,
    /// Seconds of silence after which a replica's bookings are released.
    pub peer_ttl_secs: f64,
    /// Seconds between snapshots of the indexes of workers whose events come from the
    /// plane (0: none).
    pub snapshot_secs: f64,
    /// The object store bucket of the snapshots.
    pub snapshot_bucket: String,
    /// A snapshot older than this is not loaded.
    pub snapshot_max_age_secs: f64,
    /// Largest snapshot loaded, in bytes (16 per block).
    pub max_snapshot_bytes: usize,
}

impl Default for PlaneConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            stream: "KVROUTE_EVENTS".into(),
            prefix: "kvroute".into(),
            max_age_secs: 3600.0,
            max_bytes: 1 << 30,
            max_messages_per_worker: 100_000,
            duplicate_window_secs: 120.0,
            replay_page_bytes: 512 << 10,
            replay_max_pages: 256,
            request_timeout_secs: 5.0,
            share_load: true,
            load_heartbeat_secs: 1.0,
            peer_ttl_secs: 5.0,
            snapshot_secs: 10.0,
            snapshot_bucket: "KVROUTE_SNAPSHOTS".into(),
            snapshot_max_age_secs: 600.0,
            max_snapshot_bytes: 512 << 20,
        }
    }
}

/// Invalid plane settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid event plane config: {0}")]
pub struct PlaneConfigError(pub String);

impl PlaneConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), PlaneConfigError> {
        let bad = |m: String| Err(PlaneConfigError(m));
        if self.url.trim().is_empty() {
            return bad("url is empty".into());
        }
        for u in self.url.split(',') {
            if !is_server_address(u) {
                return bad(format!("url {u:?} is not a NATS server address"));
            }
        }
        let token_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !token_ok(&self.stream) {
            return bad(format!(
                "stream {:?} must be letters, digits, '_' or '-'",
                self.stream
            ));
        }
        if !token_ok(&self.prefix) {
            return bad(format!(
                "prefix {:?} must be letters, digits, '_' or '-'",
                self.prefix
            ));
        }
        for (name, v) in [
            ("max_age_secs", self.max_age_secs),
            ("duplicate_window_secs", self.duplicate_window_secs),
            ("request_timeout_secs", self.request_timeout_secs),
            ("load_heartbeat_secs", self.load_heartbeat_secs),
            ("peer_ttl_secs", self.peer_ttl_secs),
            ("snapshot_max_age_secs", self.snapshot_max_age_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= super::MAX_TIMEOUT_SECS * 52.0) {
                return bad(format!("{name} must be > 0 and at most a year, got {v}"));
            }
        }
        if !(self.snapshot_secs == 0.0
            || (self.snapshot_secs >= 0.1 && self.snapshot_secs <= 86_400.0))
        {
            return bad(format!(
                "snapshot_secs must be 0 (off) or within 0.1..=86400, got {}",
                self.snapshot_secs
            ));
        }
        if !token_ok(&self.snapshot_bucket) {
            return bad(format!(
                "snapshot_bucket {:?} must be letters, digits, '_' or '-'",
                self.snapshot_bucket
            ));
        }
        if self.peer_ttl_secs < 2.0 * self.load_heartbeat_secs {
            return bad("peer_ttl_secs must be at least twice load_heartbeat_secs".into());
        }
        if self.duplicate_window_secs > self.max_age_secs {
            return bad("duplicate_window_secs must not exceed max_age_secs".into());
        }
        if self.max_bytes <= 0 || self.max_messages_per_worker <= 0 {
            return bad("max_bytes and max_messages_per_worker must be > 0".into());
        }
        if !(1024..=(8 << 20)).contains(&self.replay_page_bytes) {
            return bad(format!(
                "replay_page_bytes must be within 1 KiB..8 MiB, got {}",
                self.replay_page_bytes
            ));
        }
        if !(1..=65_536).contains(&self.replay_max_pages) {
            return bad(format!(
                "replay_max_pages must be within 1..65536, got {}",
                self.replay_max_pages
            ));
        }
        Ok(())
    }

    /// The subject of a worker's events.
    pub fn events_subject(&self, worker: &str) -> String {
        format!("{}.kv.{}", self.prefix, subject_token(worker))
    }

    /// The subject a worker's relay answers replay requests on.
    pub fn replay_subject(&self, worker: &str) -> String {
        format!("{}.replay.{}", self.prefix, subject_token(worker))
    }

    /// The subject the replicas share their load on.
    pub fn load_subject(&self) -> String {
        format!("{}.load", self.prefix)
    }

    /// The one request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.request_timeout_secs)
    }
}

/// Whether `u` (trimmed) reads as a NATS server address the client accepts: a URL whose
/// scheme is nats, tls, ws or wss (none written means nats). The plane crate's tests hold this
/// to async-nats's own `ServerAddr` parser on the same inputs, so the settings stay free of
/// the NATS client.
pub fn is_server_address(u: &str) -> bool {
    let u = u.trim();
    let with_scheme = if u.contains("://") {
        u.to_string()
    } else {
        format!("nats://{u}")
    };
    match reqwest::Url::parse(&with_scheme) {
        Ok(url) => matches!(url.scheme(), "nats" | "tls" | "ws" | "wss"),
        Err(_) => false,
    }
}
