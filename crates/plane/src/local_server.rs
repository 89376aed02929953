//! The configuration of a `nats-server` that kvroute starts itself on loopback (the demo's
//! event plane and the tests' servers): JetStream on, its store in a given directory, and
//! its storage limits written out.
//!
//! The limits are explicit because the server's own default for file storage is a share of
//! the disk's free space at start: on a disk with less than about 1.4 GiB free, a stream
//! asking for the default `event_plane.max_bytes` (1 GiB) is refused with "insufficient
//! storage resources available" (JetStream error 10047) and the plane never starts. The
//! stream's own `max_bytes` stays the bound on what is written.

use std::path::Path;

/// The file storage the local server offers JetStream, in bytes: room for the stream's
/// default 1 GiB bound and more.
pub const LOCAL_MAX_FILE_STORE: u64 = 4 << 30;

/// The memory storage it offers (the plane stores to files; this bounds anything else).
pub const LOCAL_MAX_MEMORY_STORE: u64 = 64 << 20;

/// The text of a `nats-server` configuration file (`nats-server -c FILE`) listening on
/// `127.0.0.1:port` with JetStream storing under `store_dir`.
pub fn local_server_config(port: u16, store_dir: &Path) -> String {
    // A JSON string is a valid quoted string in the server's configuration syntax.
    let store = serde_json::to_string(&store_dir.to_string_lossy()).unwrap_or_default();
    format!(
        "listen: \"127.0.0.1:{port}\"\n\
         jetstream {{\n  store_dir: {store}\n  max_file_store: {LOCAL_MAX_FILE_STORE}\n  \
         max_memory_store: {LOCAL_MAX_MEMORY_STORE}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_the_port_the_store_and_both_limits() {
        let text = local_server_config(4222, Path::new("/tmp/a \"b\"/store"));
        assert!(text.contains("listen: \"127.0.0.1:4222\""), "{text}");
        assert!(
            text.contains(r#"store_dir: "/tmp/a \"b\"/store""#),
            "{text}"
        );
        assert!(
            text.contains(&format!("max_file_store: {}", 4u64 << 30)),
            "{text}"
        );
        assert!(text.contains("max_memory_store: 67108864"), "{text}");
    }
}
