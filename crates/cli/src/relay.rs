//! `kvroute relay`: runs beside an engine, reads its KV events (ZMQ, with its replay
//! service) and publishes them to the NATS event plane under the worker's name, so gateways
//! read them from JetStream instead of connecting to every engine (docs/scale-out.md).

use anyhow::{Context, Result};
use clap::Args;
use kvroute_gateway::events::{zmq_feed, ZmqSubscription};
use kvroute_gateway::plane::{self, PlaneConfig, RelayOptions};
use kvroute_protocol::kv_events::EventFormat;
use std::path::PathBuf;

/// Options of `kvroute relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {
    /// The worker's name, exactly as the gateways name it (`--worker ...` with `name`, or
    /// its URL's host:port).
    #[arg(long)]
    pub worker: String,
    /// The engine's KV event publisher: `tcp://host:port`, or `bind:tcp://host:port` (the
    /// engine connects to the relay).
    #[arg(long)]
    pub events: String,
    /// The engine's replay endpoint (`tcp://host:port`), when it serves one.
    #[arg(long)]
    pub replay: Option<String>,
    /// The engine's wire form (vllm, sglang, trtllm): payloads are passed on in it.
    #[arg(long, default_value = "vllm")]
    pub event_format: EventFormat,
    /// The NATS server(s), comma-separated.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// A TOML file with the plane's settings (the gateway's `[plane]` table: stream, prefix,
    /// limits); --nats overrides its url.
    #[arg(long)]
    pub plane_config: Option<PathBuf>,
    /// Largest KV event message accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_message_bytes: usize,
}

/// Runs the relay until Ctrl-C.
pub fn run(args: &RelayArgs) -> Result<()> {
    let mut plane: PlaneConfig = crate::read_toml(args.plane_config.as_deref())?;
    plane.url = args.nats.clone();
    plane.validate()?;
    let (endpoint, bind) = match args.events.strip_prefix("bind:") {
        Some(rest) => (rest.to_string(), true),
        None => (args.events.clone(), false),
    };
    for ep in std::iter::once(&endpoint).chain(args.replay.as_ref()) {
        let ok = ep
            .strip_prefix("tcp://")
            .and_then(|a| a.rsplit_once(':'))
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        anyhow::ensure!(ok, "endpoint {ep:?} must look like tcp://host:port");
    }
    crate::runtime()?.block_on(async move {
        let feed = zmq_feed(ZmqSubscription {
            worker: args.worker.clone(),
            endpoint,
            bind,
            replay: args.replay.clone(),
            max_message_bytes: args.max_message_bytes,
            heartbeat_secs: 5.0,
            heartbeat_timeout_secs: 30.0,
            replay_timeout_secs: plane.request_timeout_secs,
        })
        .context("subscribing to the engine's events")?;
        let conn = plane::connect(&plane, &format!("kvroute-relay {}", args.worker))
            .await
            .with_context(|| format!("connecting to {}", plane.url))?;
        // A new incarnation per start: the dedup ids of a restarted relay never collide
        // with its predecessor's.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        println!(
            "kvroute relay: {} -> {} ({})",
            args.events,
            plane.events_subject(&args.worker),
            plane.url
        );
        let opts = RelayOptions {
            worker: args.worker.clone(),
            format: args.event_format,
            plane,
            incarnation,
        };
        tokio::select! {
            n = plane::run_relay(conn.client, opts, feed) => println!("the engine's feed ended after {n} items"),
            r = tokio::signal::ctrl_c() => { r.context("waiting for Ctrl-C")?; println!("stopping"); }
        }
        Ok(())
    })
}
