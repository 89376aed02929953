//! The NATS event plane: engines' KV events carried over a JetStream stream, so several
//! gateways share them and none needs a network path to every engine.
//!
//! - `kvroute relay` runs beside an engine: it reads the engine's KV events (ZMQ, as the
//!   gateway would) and publishes every feed item ([`kvroute_protocol::plane::Item`]: a batch with the
//!   engine's own sequence number and payload, connects, disconnects) to the stream, one
//!   subject per worker (`PREFIX.kv.WORKER`), each message with a dedup id
//!   (`Nats-Msg-Id`) so a publish retried after a lost acknowledgement is stored once. It
//!   also answers replay requests (`PREFIX.replay.WORKER`) from the engine's replay service,
//!   in pages that fit a NATS message.
//! - A gateway whose worker says `events = "nats"` reads that subject with an ordered
//!   consumer (it resumes from the last stream sequence it saw after a reconnect or a NATS
//!   restart) and feeds the items to the same ingestion as a direct ZMQ feed: the sequence
//!   checks, gap replays (over NATS, through the relay) and restart detection are the ones
//!   `events.rs` already runs.

mod connection;
mod feed;
mod items;
mod load;
mod local_server;
mod relay;
mod snapshot;

pub use connection::Connection;
pub use feed::{connect, nats_feed, NatsFeeds};
pub use load::{start as share_load, LoadShare};
pub use local_server::{local_server_config, LOCAL_MAX_FILE_STORE, LOCAL_MAX_MEMORY_STORE};
pub use relay::{run_relay, RelayOptions, RelayStatus};
pub use snapshot::start as write_snapshots;

pub use kvroute_protocol::plane::subject_token;

pub use kvroute_fleet::config::{PlaneConfig, PlaneConfigError};
use std::time::Duration;

/// Now, in nanoseconds since the Unix epoch (0 if the clock is before it): the time stamps
/// of load messages and snapshots.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The JetStream stream's configuration for `plane`'s settings.
pub fn stream_config(plane: &PlaneConfig) -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: plane.stream.clone(),
        subjects: vec![format!("{}.kv.>", plane.prefix)],
        max_age: Duration::from_secs_f64(plane.max_age_secs),
        max_bytes: plane.max_bytes,
        max_messages_per_subject: plane.max_messages_per_worker,
        duplicate_window: Duration::from_secs_f64(plane.duplicate_window_secs),
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    }
}

/// A new id for a relay or gateway replica that starts (dedup ids and bookings are named by
/// it): the clock and the process id mixed, so two starts never share one.
pub fn incarnation() -> u64 {
    kvroute_core::hashing::splitmix64(unix_ns() ^ u64::from(std::process::id()).rotate_left(32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_carry_the_worker_as_one_token() {
        let c = PlaneConfig::default();
        assert_eq!(c.events_subject("vllm/dp1"), "kvroute.kv.vllm_2fdp1");
        assert_eq!(c.replay_subject("x"), "kvroute.replay.x");
    }

    #[test]
    fn the_settings_read_server_addresses_as_the_nats_client_does() {
        let inputs = [
            "nats://127.0.0.1:4222",
            "127.0.0.1:4222",
            " localhost ",
            "tls://nats.example:4443",
            "ws://h:80",
            "wss://user:pw@h",
            "http://h:4222",
            "nats://",
            "nats://[::1]:4222",
            "nats://h:99999",
            "::",
            "",
            "a b",
            "nats://h:4222/path",
        ];
        for u in inputs {
            let theirs = u.trim().parse::<async_nats::ServerAddr>().is_ok();
            let ours = kvroute_fleet::config::is_server_address(u);
            assert_eq!(
                ours, theirs,
                "{u:?}: settings say {ours}, async-nats {theirs}"
            );
        }
    }

    #[test]
    fn bad_settings_are_refused_with_their_name() {
        assert!(PlaneConfig::default().validate().is_ok());
        let with = |f: fn(&mut PlaneConfig)| {
            let mut c = PlaneConfig::default();
            f(&mut c);
            c.validate().unwrap_err().0
        };
        assert!(with(|c| c.url = String::new()).contains("url"));
        assert!(with(|c| c.stream = "a.b".into()).contains("stream"));
        assert!(with(|c| c.prefix = "x>".into()).contains("prefix"));
        assert!(with(|c| c.max_age_secs = 0.0).contains("max_age_secs"));
        assert!(with(|c| c.duplicate_window_secs = 7200.0).contains("duplicate_window"));
        assert!(with(|c| c.replay_page_bytes = 10).contains("replay_page_bytes"));
        assert!(with(|c| c.replay_max_pages = 0).contains("replay_max_pages"));
        assert!(with(|c| c.max_bytes = -1).contains("max_bytes"));
        assert!(with(|c| c.peer_ttl_secs = 1.5).contains("peer_ttl_secs"));
    }
}
