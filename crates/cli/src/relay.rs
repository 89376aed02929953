//! `kvroute relay`: runs beside an engine, reads its KV events (ZMQ, with its replay
//! service, or TensorRT-LLM's HTTP pull API) and publishes them to the NATS event plane under the worker's name, so gateways
//! read them from JetStream instead of connecting to every engine (docs/scale-out.md).

use anyhow::{Context, Result};
use clap::Args;
use kvroute_events::{poll_feeds, zmq_feed, PollSubscription, ZmqSubscription};
use kvroute_plane::{self as plane, PlaneConfig, RelayOptions};
use kvroute_protocol::kv_events::EventFormat;
use std::path::PathBuf;
use std::sync::Arc;

mod probes;

/// Options of `kvroute relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {
    /// The worker's name, exactly as the gateways name it (`--worker ...` with `name`, or
    /// its URL's host:port).
    #[arg(long)]
    pub worker: String,
    /// The engine's KV event publisher: `tcp://host:port`, or `bind:tcp://host:port` (the
    /// engine connects to the relay), or `poll:http://host:port/kv_cache_events`
    /// (TensorRT-LLM's pull API; needs --block-size).
    #[arg(long)]
    pub events: String,
    /// The engine's replay endpoint (`tcp://host:port`), when it serves one.
    #[arg(long)]
    pub replay: Option<String>,
    /// The engine's wire form (vllm, sglang, trtllm): payloads are passed on in it.
    #[arg(long, default_value = "vllm")]
    pub event_format: EventFormat,
    /// The NATS server(s), comma-separated (default: the file's url, else
    /// nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// A TOML file with the plane's settings: the gateway's own config file (its `[plane]`
    /// table: stream, prefix, limits, so relays and gateways agree), or those keys alone;
    /// --nats overrides its url.
    #[arg(long)]
    pub plane_config: Option<PathBuf>,
    /// Largest KV event message accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_message_bytes: usize,
    /// The KV block size in tokens (a pull API's partial blocks are dropped by it).
    #[arg(long)]
    pub block_size: Option<u64>,
    /// Seconds between calls to a pull API.
    #[arg(long, default_value_t = 0.2)]
    pub poll_secs: f64,
    /// Address of the probes' HTTP port (`/live`, `/ready`, `/metrics`); in a Pod,
    /// `0.0.0.0` so that the kubelet reaches it.
    #[arg(long, default_value = "127.0.0.1")]
    pub http_host: String,
    /// The probes' port (0: any free one, printed).
    #[arg(long, default_value_t = 9400)]
    pub http_port: u16,
}

/// Runs the relay until Ctrl-C.
pub fn run(args: &RelayArgs) -> Result<()> {
    let mut plane = plane_config(args.plane_config.as_deref())?;
    if let Some(url) = &args.nats {
        plane.url = url.clone();
    }
    plane.validate()?;
    let poll = args.events.strip_prefix("poll:").map(str::to_string);
    let (endpoint, bind) = match args.events.strip_prefix("bind:") {
        Some(rest) => (rest.to_string(), true),
        None => (args.events.clone(), false),
    };
    match &poll {
        Some(url) => {
            anyhow::ensure!(
                url.starts_with("http://") || url.starts_with("https://"),
                "--events poll:URL needs an http(s) URL, got {url:?}"
            );
            anyhow::ensure!(args.replay.is_none(), "a pull API has no replay endpoint");
            anyhow::ensure!(
                args.block_size.is_some_and(|b| b > 0),
                "--events poll:URL needs --block-size (the engine's tokens per block)"
            );
            anyhow::ensure!(
                args.poll_secs.is_finite() && (0.01..=60.0).contains(&args.poll_secs),
                "--poll-secs must be within 0.01..=60"
            );
        }
        None => {
            for ep in std::iter::once(&endpoint).chain(args.replay.as_ref()) {
                let ok = ep
                    .strip_prefix("tcp://")
                    .and_then(|a| a.rsplit_once(':'))
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
                anyhow::ensure!(ok, "endpoint {ep:?} must look like tcp://host:port");
            }
        }
    }
    crate::runtime()?.block_on(async move {
        let feed = match poll {
            Some(url) => {
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .context("an HTTP client")?;
                poll_feeds(
                    client,
                    PollSubscription {
                        worker: args.worker.clone(),
                        url,
                        api_key: std::env::var("KVROUTE_UPSTREAM_API_KEY").ok(),
                        interval_secs: args.poll_secs,
                        timeout_secs: 5.0,
                        max_bytes: args.max_message_bytes,
                        block_size: args.block_size.unwrap_or(0),
                        ranks: 1,
                    },
                )
                .into_iter()
                .next()
                .context("the pull API's feed")?
            }
            None => zmq_feed(ZmqSubscription {
                worker: args.worker.clone(),
                endpoint,
                bind,
                replay: args.replay.clone(),
                max_message_bytes: args.max_message_bytes,
                heartbeat_secs: 5.0,
                heartbeat_timeout_secs: 30.0,
                replay_timeout_secs: plane.request_timeout_secs,
            })
            .context("subscribing to the engine's events")?,
        };
        let conn = plane::connect(&plane, &format!("kvroute-relay {}", args.worker))
            .await
            .with_context(|| format!("connecting to {}", plane.url))?;
        let status = Arc::new(plane::RelayStatus::default());
        let addr = format!("{}:{}", args.http_host, args.http_port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr} (--http-host, --http-port)"))?;
        println!(
            "kvroute relay probes on http://{}",
            listener.local_addr().context("the probes' address")?
        );
        let app = probes::app(probes::Probes {
            status: Arc::clone(&status),
            nats_up: conn.up.clone(),
            worker: args.worker.clone(),
        });
        tokio::spawn(kvroute_runtime::serve(
            listener,
            app,
            Default::default(),
            None,
            std::future::pending(),
        ));
        // A new incarnation per start: the dedup ids of a restarted relay never collide
        // with its predecessor's.
        let incarnation = plane::incarnation();
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
            status,
        };
        tokio::select! {
            n = plane::run_relay(conn.client, opts, feed) => println!("the engine's feed ended after {n} items"),
            r = tokio::signal::ctrl_c() => { r.context("waiting for Ctrl-C")?; println!("stopping"); }
        }
        Ok(())
    })
}

/// The plane's settings from `path`: its `[plane]` table when it has one (a gateway's
/// config file), else the whole file; the defaults without a file.
fn plane_config(path: Option<&std::path::Path>) -> Result<PlaneConfig> {
    let Some(path) = path else {
        return Ok(PlaneConfig::default());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: toml::Table = toml::from_str(&text).with_context(|| path.display().to_string())?;
    let table = match value.get("plane") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(_) => anyhow::bail!("{}: `plane` is not a table", path.display()),
        None => value,
    };
    table
        .try_into()
        .with_context(|| format!("{}: the plane's settings", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plane_settings_come_from_a_gateway_file_or_alone() {
        let dir = tempfile::tempdir().unwrap();
        let gateway = dir.path().join("gateway.toml");
        std::fs::write(
            &gateway,
            "port = 8000\n[router]\nblock_size = 32\n[plane]\nurl = \"nats://nats:4222\"\nprefix = \"fleet\"\n",
        )
        .unwrap();
        let p = plane_config(Some(&gateway)).unwrap();
        assert_eq!(
            (p.url.as_str(), p.prefix.as_str()),
            ("nats://nats:4222", "fleet")
        );
        let alone = dir.path().join("plane.toml");
        std::fs::write(&alone, "stream = \"EVENTS\"\n").unwrap();
        assert_eq!(plane_config(Some(&alone)).unwrap().stream, "EVENTS");
        std::fs::write(&alone, "strem = \"EVENTS\"\n").unwrap();
        assert!(
            plane_config(Some(&alone)).is_err(),
            "unknown keys are refused"
        );
        assert_eq!(plane_config(None).unwrap(), PlaneConfig::default());
    }
}
