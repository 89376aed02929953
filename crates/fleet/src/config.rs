//! The gateway's settings: one struct tree, read from a TOML file, then overridden by the
//! command line, then checked by [`GatewayConfig::validate`]. Defaults are written once, here.

mod diff;
mod engine_priority;
mod event_plane;
mod flow_headers;
mod listener;
mod picker;
mod pools;
mod prediction_loop;
mod ranks;
mod worker_sources;

pub use ranks::expand as expand_ranks;

pub use diff::changed_keys;
pub use engine_priority::EnginePriority;
pub use event_plane::{is_server_address, PlaneConfig, PlaneConfigError};
pub use flow_headers::FlowHeaders;
pub use kvroute_core::WorkerRole;
use kvroute_core::{RouterConfig, WorkerCapacity};
use kvroute_protocol::openai::Endpoint;
pub use kvroute_runtime::Secret;
pub use listener::{AuthConfig, TlsConfig};
pub use picker::EppConfig;
pub use pools::{Pool, PoolConfig, MAX_POOLS};
pub use prediction_loop::AccuracyConfig;
use serde::{Deserialize, Serialize};
pub use worker_sources::{url_host, DiscoveryConfig, DnsSource, KubernetesSource};

/// Everything the gateway needs to know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0: any free port).
    pub port: u16,
    /// Model names served; empty: whatever the workers list at `/v1/models`.
    pub models: Vec<String>,
    /// LoRA adapter names: a request whose `model` names one is hashed in that adapter's
    /// namespace, so it matches only blocks the engines stored for the adapter. Adapters the
    /// workers list at `/v1/models` (entries with a `parent`) are added to these.
    pub lora_adapters: Vec<String>,
    /// Tokenizer directory (`tokenizer.json` + `tokenizer_config.json`), `builtin` for the
    /// small tokenizer shipped with kvroute (`builtin-small`: it with its first 256 merges
    /// only). None: approximate mode (routing on byte chunks of
    /// the rendered prompt, without KV events).
    pub tokenizer: Option<String>,
    /// The routing core: block size, policy, admission, seed.
    pub router: RouterConfig,
    /// The engines behind the gateway.
    pub workers: Vec<WorkerSpec>,
    /// The batch limit of workers that give none of their own `max_batch` (discovered ones
    /// too): requests an engine runs at once (vLLM `--max-num-seqs`, SGLang
    /// `--max-running-requests`, TensorRT-LLM `max_batch_size`). None: unknown.
    #[serde(alias = "max_num_seqs")]
    pub max_batch: Option<u32>,
    /// Limits on requests.
    pub limits: Limits,
    /// Health checking.
    pub health: HealthConfig,
    /// Calls to workers.
    pub upstream: UpstreamConfig,
    /// The closed loop on prediction accuracy.
    pub accuracy: AccuracyConfig,
    /// Who may call the gateway.
    pub auth: AuthConfig,
    /// TLS for the listener.
    pub tls: TlsConfig,
    /// The NATS event plane, for workers whose events come through it (`events = "nats"`).
    pub plane: Option<PlaneConfig>,
    /// Workers found while running (a watched file, DNS names) besides `workers`.
    pub discovery: DiscoveryConfig,
    /// The endpoint picker (`kvroute epp`): its ports and limits.
    pub epp: EppConfig,
    /// The headers naming a request's tenant, class and objective (the tenants and classes
    /// themselves are `router.admission.flow`'s).
    pub flow_headers: FlowHeaders,
    /// Several models behind one listener, one pool each (see [`PoolConfig`]); empty: the
    /// top level describes the one pool.
    pub pools: Vec<PoolConfig>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            models: Vec::new(),
            lora_adapters: Vec::new(),
            tokenizer: None,
            router: RouterConfig::default(),
            workers: Vec::new(),
            max_batch: None,
            limits: Limits::default(),
            health: HealthConfig::default(),
            upstream: UpstreamConfig::default(),
            accuracy: AccuracyConfig::default(),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            plane: None,
            discovery: DiscoveryConfig::default(),
            epp: EppConfig::default(),
            flow_headers: FlowHeaders::default(),
            pools: Vec::new(),
        }
    }
}

/// One engine replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSpec {
    /// Its OpenAI-compatible base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// A name for logs and metric labels (default: the URL's host and port).
    pub name: Option<String>,
    /// Its KV event source, when it has one: a ZMQ endpoint, `tcp://host:port` (the gateway
    /// connects to the engine's PUB socket) or `bind:tcp://host:port` (the gateway binds, the
    /// engine connects: vLLM connects its publisher for any endpoint but a wildcard one); or a
    /// pull API polled over HTTP (TensorRT-LLM): `poll` for `URL/kv_cache_events`, or
    /// `poll:http://host:port/path`; or `nats`: from the event plane (`[plane]`), where a
    /// `kvroute relay` beside the engine publishes them under this worker's name.
    pub events: Option<String>,
    /// Its ZMQ replay endpoint, when it serves one.
    pub replay: Option<String>,
    /// Its KV cache size in blocks, when known (admission fractions, policies).
    pub kv_blocks: Option<u64>,
    /// Its batch limit, when known: requests it runs at once (vLLM `--max-num-seqs`, SGLang
    /// `--max-running-requests`, TensorRT-LLM `max_batch_size`); else the gateway's
    /// `max_batch`.
    #[serde(alias = "max_num_seqs")]
    pub max_batch: Option<u32>,
    /// Its data-parallel ranks (vLLM `--data-parallel-size`, SGLang `--dp-size` with DP
    /// attention), when more than one: each rank has a KV cache of its own and is routed to as
    /// a worker of its own, named `NAME/dpR`, its events on the event and replay ports plus
    /// its rank (the engines' convention), its requests steered there with the
    /// `X-Data-Parallel-Rank` header. `kv_blocks` and `max_batch` are then per rank.
    pub dp_size: Option<u32>,
    /// What it does in a disaggregated fleet: `both` (the default), `prefill` or `decode`.
    /// A prefill-only worker is never a request's worker: it serves prefill legs only.
    pub role: WorkerRole,
    /// A prefill worker's bootstrap port, for SGLang's transfer (`upstream.kv_transfer =
    /// "sglang"`: its `--disaggregation-bootstrap-port`); default
    /// [`DEFAULT_BOOTSTRAP_PORT`].
    pub bootstrap_port: Option<u16>,
    /// Which rank of its engine this entry is, once the ranks are expanded (set by the
    /// gateway, never configured).
    #[serde(skip)]
    pub dp_rank: Option<u32>,
    /// Its key (`Authorization: Bearer`), when it was started with one (vLLM `--api-key`);
    /// else `upstream.api_key`.
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// Whether it takes the engine's own `priority` field, and which values it serves first
    /// (vLLM with `--scheduling-policy priority`: `lower_first`; SGLang with
    /// `--enable-priority-scheduling`: `higher_first`, or `lower_first` with
    /// `--schedule-low-priority-values-first`). Unset: the gateway never sets the field (vLLM
    /// refuses a non-zero `priority` without that policy). A request's class's
    /// `engine_priority` (lower = sooner) is sent as it is or negated to match.
    pub priority: Option<EnginePriority>,
    /// The model it serves, when the source says so (a discovery file's entry, a DNS
    /// source's `model`, a Pod's `kvroute.io/model` annotation or label). With `[[pools]]`
    /// and discovery shared between them (top-level `[discovery]` sources) it picks the pool
    /// the engine joins; unset, the engine's `/v1/models` is asked. A pool's own worker
    /// naming a model must name one the pool serves.
    pub model: Option<String>,
}

impl WorkerSpec {
    /// Parses the command-line form
    /// `URL[=EVENTS[=REPLAY]][,dp=N][,role=ROLE][,priority=ORDER]` (the options in any
    /// order), e.g.
    /// `http://127.0.0.1:8001=tcp://127.0.0.1:5557=tcp://127.0.0.1:5558,dp=2,role=decode`.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let whole = s;
        let mut s = s;
        let mut dp_size = None;
        let mut role = None;
        let mut priority = None;
        // Trailing `,key=value` options, last first.
        while let Some((rest, option)) = s.rsplit_once(',') {
            let Some((key, value)) = option.split_once('=') else {
                break;
            };
            match key {
                "dp" if dp_size.is_none() => {
                    dp_size = Some(value.parse::<u32>().map_err(|_| {
                        ConfigError(format!(
                            "worker {whole:?}: dp={value:?} is not a rank count"
                        ))
                    })?);
                }
                "role" if role.is_none() => {
                    role = Some(
                        value
                            .parse::<WorkerRole>()
                            .map_err(|e| ConfigError(format!("worker {whole:?}: {e}")))?,
                    );
                }
                "priority" if priority.is_none() => {
                    priority = Some(
                        value
                            .parse::<EnginePriority>()
                            .map_err(|e| ConfigError(format!("worker {whole:?}: {e}")))?,
                    );
                }
                "dp" | "role" | "priority" => {
                    return Err(ConfigError(format!(
                        "worker {whole:?}: {key}= is given twice"
                    )))
                }
                _ => break,
            }
            s = rest;
        }
        let mut parts = s.splitn(3, '=');
        let url = parts.next().unwrap_or_default().to_string();
        let events = parts.next().map(str::to_string);
        let replay = parts.next().map(str::to_string);
        let spec = Self {
            url,
            events,
            replay,
            dp_size,
            role: role.unwrap_or_default(),
            priority,
            ..Self::default()
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The name used in logs and labels.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            self.url
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_string()
        })
    }

    /// The URL of its events pull API, when its events are polled over HTTP.
    pub fn event_poll_url(&self) -> Option<String> {
        let ep = self.events.as_deref()?;
        if ep == "poll" {
            return Some(format!(
                "{}/kv_cache_events",
                self.url.trim_end_matches('/')
            ));
        }
        ep.strip_prefix("poll:").map(str::to_string)
    }

    /// Whether its events come from the NATS event plane.
    pub fn events_from_plane(&self) -> bool {
        self.events.as_deref() == Some("nats")
    }

    /// The event endpoint without its `bind:` prefix, and whether the gateway binds it
    /// (None for a pull API or the event plane).
    pub fn event_socket(&self) -> Option<(&str, bool)> {
        let ep = self.events.as_deref()?;
        if self.event_poll_url().is_some() || self.events_from_plane() {
            return None;
        }
        Some(match ep.strip_prefix("bind:") {
            Some(rest) => (rest, true),
            None => (ep, false),
        })
    }

    /// What the router knows of its capacity, `default_max_batch` (the gateway's
    /// `max_batch`) standing in for a batch limit it does not give.
    pub fn capacity(&self, default_max_batch: Option<u32>) -> WorkerCapacity {
        WorkerCapacity {
            kv_blocks: self.kv_blocks,
            max_batch: self.max_batch.or(default_max_batch),
        }
    }

    /// Checks one worker's settings (a worker joining at run time).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.validate()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if let Some(m) = &self.model {
            if !is_name(m) {
                return bad(format!(
                    "worker {}: model must be 1 to 256 characters without control characters, got {m:?}",
                    self.url
                ));
            }
        }
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return bad(format!(
                "worker URL {:?} must start with http:// or https://",
                self.url
            ));
        }
        if let Err(e) = endpoint_url(&self.url, Endpoint::Chat) {
            return bad(format!("worker URL {:?} is not a valid URL: {e}", self.url));
        }
        let events = self.event_socket().map(|e| e.0);
        for (what, ep) in [("events", events), ("replay", self.replay.as_deref())] {
            if let Some(ep) = ep {
                let ok = ep
                    .strip_prefix("tcp://")
                    .and_then(|a| a.rsplit_once(':'))
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !ok {
                    return bad(format!(
                        "worker {}: {what} endpoint {ep:?} must look like tcp://host:port (events may start with bind:)",
                        self.url
                    ));
                }
            }
        }
        if let Some(url) = self.event_poll_url() {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || reqwest::Url::parse(&url).is_err()
            {
                return bad(format!(
                    "worker {}: the events pull API {url:?} must be an http(s) URL",
                    self.url
                ));
            }
            if self.replay.is_some() {
                return bad(format!(
                    "worker {}: a pull API of events has no replay endpoint",
                    self.url
                ));
            }
        }
        ranks::validate(self)?;
        if self.events_from_plane() && self.replay.is_some() {
            return bad(format!(
                "worker {}: events from the plane are replayed through its relay, not a replay endpoint",
                self.url
            ));
        }
        if self.replay.is_some() && self.events.is_none() {
            return bad(format!(
                "worker {}: a replay endpoint needs an events endpoint",
                self.url
            ));
        }
        if self.max_batch == Some(0) {
            return bad(format!("worker {}: max_batch must be >= 1", self.url));
        }
        Ok(())
    }
}

/// Limits on what a client may send.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest request body, in bytes (413 past it).
    pub max_body_bytes: usize,
    /// Longest prompt, in tokens (413 past it).
    pub max_prompt_tokens: usize,
    /// Largest non-streamed answer read from a worker, in bytes (502 past it).
    pub max_response_bytes: usize,
    /// Seconds a client has to send a request's headers, counted from when its connection
    /// is ready for a request: so also the longest idle keep-alive gap.
    pub header_read_timeout_secs: f64,
    /// Seconds a client has to send a request's body (408 past it).
    pub body_read_timeout_secs: f64,
    /// Most client connections open at once; past it a few more are answered `503
    /// too_many_connections` (`/live` still answers) and the rest closed at once. Keep it
    /// below the process's file descriptor limit (`ulimit -n`) minus what the connections
    /// to workers need.
    pub max_connections: usize,
    /// Bytes of tokenized prompt pieces the tokenizer keeps (0: none): repeated system
    /// prompts and earlier turns are not tokenized again.
    pub tokenizer_cache_bytes: usize,
    /// Threads that tokenize prompts (at least 1): the tokenizer library keeps caches of up
    /// to ~100 MiB per thread that tokenizes, so this bounds them, whatever the core count.
    pub tokenizer_threads: usize,
    /// Prompts that may wait for a tokenizing thread (at least 1); past it requests get
    /// `503 tokenizer_busy` with `Retry-After`.
    pub tokenizer_queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let serve = kvroute_runtime::ServeLimits::default();
        Self {
            max_body_bytes: 8 << 20,
            max_prompt_tokens: 262_144,
            max_response_bytes: 64 << 20,
            header_read_timeout_secs: serve.header_read_timeout.as_secs_f64(),
            body_read_timeout_secs: kvroute_runtime::BODY_READ_TIMEOUT.as_secs_f64(),
            max_connections: serve.max_connections,
            tokenizer_cache_bytes: kvroute_preprocess::PIECE_CACHE_BYTES,
            tokenizer_threads: kvroute_preprocess::DEFAULT_TOKENIZE_THREADS,
            tokenizer_queue: kvroute_preprocess::DEFAULT_TOKENIZE_QUEUE,
        }
    }
}

/// Health checking of workers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Seconds between checks of each worker.
    pub interval_secs: f64,
    /// Seconds a check may take.
    pub timeout_secs: f64,
    /// Consecutive failed checks that take a worker out.
    pub failures_to_remove: u32,
    /// `/ready` answers 200 while no engine is up (its body says how many are): the gateway
    /// stays in its Service and answers requests 503 with `Retry-After` itself, instead of
    /// clients getting connection errors. False: 503 until an engine is up.
    pub ready_without_engines: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_secs: 2.0,
            timeout_secs: 2.0,
            failures_to_remove: 2,
            ready_without_engines: true,
        }
    }
}

/// Calls to workers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Seconds to open a connection.
    pub connect_timeout_secs: f64,
    /// Seconds until the answer's headers arrive (and, for a stream, its first chunk).
    pub first_byte_timeout_secs: f64,
    /// Seconds an answer may go silent after its first byte (between stream chunks, or
    /// within a whole answer's body) before the gateway gives up on the worker: a stream
    /// then ends with an `upstream_timeout` error event.
    pub idle_timeout_secs: f64,
    /// Retry a request that failed before its first byte once, on another worker.
    pub retry: bool,
    /// How many times a stream whose worker died or went silent after its first byte is
    /// carried on by another worker (the prompt plus what was streamed, as a continuation),
    /// the client seeing one stream; 0: never (the stream ends with an error event). A
    /// request opts out with `x-kvroute-migrate: off`.
    pub migration_limit: u32,
    /// Key sent to every worker without one of its own (`Authorization: Bearer`), for
    /// engines started with `--api-key`. Also from `KVROUTE_UPSTREAM_API_KEY`.
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// Send the client's own `Authorization` header to the worker instead of the worker's
    /// key (when the client sent one).
    pub forward_authorization: bool,
    /// Seconds to wait for a replay of missed KV events.
    pub replay_timeout_secs: f64,
    /// Largest KV event message accepted, in bytes: a publisher announcing a larger frame
    /// is disconnected (and reconnected) instead of being read.
    pub max_event_message_bytes: usize,
    /// Seconds between ZMTP heartbeats on KV event connections (0: none), so a publisher
    /// whose connection died silently is noticed while it is idle.
    pub event_heartbeat_secs: f64,
    /// Seconds without an answer to a heartbeat before the connection is dropped and
    /// reconnected.
    pub event_heartbeat_timeout_secs: f64,
    /// Seconds between calls to a pull API of KV events (TensorRT-LLM's
    /// `POST /kv_cache_events`).
    pub event_poll_secs: f64,
    /// The longest such a call may take, in seconds.
    pub event_poll_timeout_secs: f64,
    /// How a split request's KV goes from its prefill worker to its decode worker, in the
    /// engines' protocol (docs/disaggregation.md): `vllm` (the prefill leg with
    /// `max_tokens: 1` and `kv_transfer_params: {"do_remote_decode": true}`, the parameters
    /// its answer returns passed to the decode leg: NixlConnector, and connectors that need
    /// none such as the shared-storage `ExampleConnector`), `sglang` (both legs at once, the
    /// same body with `bootstrap_host`, `bootstrap_port` and a fresh `bootstrap_room`),
    /// `trtllm` (`disaggregated_params`: `context_only`, then `generation_only` with the
    /// context server's state), or `none` (requests are never split; prefill-only workers
    /// then serve nothing).
    pub kv_transfer: KvTransfer,
}

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// The engines' protocol for moving a split request's KV (`upstream.kv_transfer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvTransfer {
    /// vLLM's `kv_transfer_params`, one leg after the other.
    #[default]
    Vllm,
    /// SGLang's bootstrap server: both legs at once, one `bootstrap_room`.
    Sglang,
    /// TensorRT-LLM's `disaggregated_params`: a `context_only` leg, then a
    /// `generation_only` one with the context server's state and prompt token ids.
    Trtllm,
    /// No split requests.
    None,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout_secs: 2.0,
            first_byte_timeout_secs: 120.0,
            idle_timeout_secs: 60.0,
            retry: true,
            migration_limit: 3,
            api_key: None,
            forward_authorization: false,
            replay_timeout_secs: 2.0,
            max_event_message_bytes: 64 << 20,
            event_heartbeat_secs: 5.0,
            event_heartbeat_timeout_secs: 30.0,
            event_poll_secs: 0.2,
            event_poll_timeout_secs: 5.0,
            kv_transfer: KvTransfer::default(),
        }
    }
}

/// The longest timeout the config takes, in seconds (a week).
pub const MAX_TIMEOUT_SECS: f64 = 7.0 * 86_400.0;

/// The most migrations a stream may go through (`upstream.migration_limit`).
pub const MAX_MIGRATIONS: u32 = 16;

/// The most tokenizing threads (`limits.tokenizer_threads`): each may hold ~100 MiB of the
/// tokenizer library's caches.
pub const MAX_TOKENIZER_THREADS: usize = 64;

/// Whether `s` can name a model or a pool: 1 to 256 characters without control characters.
pub(crate) fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control)
}

/// Invalid settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid gateway config: {0}")]
pub struct ConfigError(pub String);

impl GatewayConfig {
    /// What clients may hold open, for the HTTP server.
    pub fn serve_limits(&self) -> kvroute_runtime::ServeLimits {
        kvroute_runtime::ServeLimits {
            header_read_timeout: std::time::Duration::from_secs_f64(
                self.limits.header_read_timeout_secs,
            ),
            max_connections: self.limits.max_connections,
            ..Default::default()
        }
    }

    /// Reads a TOML file's text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(e.to_string()))
    }

    /// What the router knows of `w`'s capacity: its own settings, the gateway's
    /// `max_batch` for a batch limit it does not give.
    pub fn capacity_of(&self, w: &WorkerSpec) -> WorkerCapacity {
        w.capacity(self.max_batch)
    }

    /// The access policy of a listener (`loopback`: bound to a loopback address): `auth`'s,
    /// the tenants' API keys accepted beside `auth.api_keys` (an API open to anyone stays
    /// open; a tenant's key then only names its tenant).
    pub fn access_policy(&self, loopback: bool) -> kvroute_runtime::AccessPolicy {
        let mut policy = self.auth.policy(loopback);
        if !policy.api_keys.is_empty() {
            let tenants = &self.router.admission.flow.tenants;
            policy
                .api_keys
                .extend(tenants.iter().flat_map(|t| t.api_keys.iter().cloned()));
        }
        policy
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.has_pools() {
            return self.pools().map(|_| ());
        }
        self.validate_pool(true)
    }

    /// Checks one pool's settings; `needs_workers`: it must have workers or a discovery
    /// source of its own (not so with discovery shared between pools).
    pub fn validate_pool(&self, needs_workers: bool) -> Result<(), ConfigError> {
        if self.max_batch == Some(0) {
            return Err(ConfigError("max_batch must be >= 1".into()));
        }
        self.router
            .validate()
            .map_err(|e| ConfigError(e.to_string()))?;
        self.discovery.validate()?;
        if needs_workers && self.workers.is_empty() && !self.discovery.enabled() {
            return Err(ConfigError(
                "at least one worker is required (or a discovery source)".into(),
            ));
        }
        self.accuracy.validate().map_err(ConfigError)?;
        self.flow_headers.validate().map_err(ConfigError)?;
        match &self.plane {
            Some(p) => p.validate().map_err(|e| ConfigError(e.to_string()))?,
            None => {
                if let Some(w) = self.workers.iter().find(|w| w.events_from_plane()) {
                    return Err(ConfigError(format!(
                        "worker {}: events = \"nats\" needs the event plane ([plane] url, or --nats)",
                        w.display_name()
                    )));
                }
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for w in &self.workers {
            w.validate()?;
            if !names.insert(w.display_name()) {
                return Err(ConfigError(format!(
                    "two workers are named {:?}",
                    w.display_name()
                )));
            }
        }
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError(format!("{name} must be > 0, got {v}")))
            }
        };
        // Seconds that become `Duration`s: positive and at most a week (a larger value
        // would overflow a deadline).
        let secs = |name: &str, v: f64| {
            positive(name, v)?;
            if v > MAX_TIMEOUT_SECS {
                return Err(ConfigError(format!(
                    "{name} must be at most {MAX_TIMEOUT_SECS} s, got {v}"
                )));
            }
            Ok(())
        };
        secs(
            "upstream.idle_timeout_secs",
            self.upstream.idle_timeout_secs,
        )?;
        secs(
            "limits.header_read_timeout_secs",
            self.limits.header_read_timeout_secs,
        )?;
        secs(
            "limits.body_read_timeout_secs",
            self.limits.body_read_timeout_secs,
        )?;
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(ConfigError(
                "tls.cert_file and tls.key_file go together: give both or neither".into(),
            ));
        }
        if self.upstream.migration_limit > MAX_MIGRATIONS {
            return Err(ConfigError(format!(
                "upstream.migration_limit must be at most {MAX_MIGRATIONS}, got {}",
                self.upstream.migration_limit
            )));
        }
        let max_connections = kvroute_runtime::MAX_CONNECTIONS;
        if !(1..=max_connections).contains(&self.limits.max_connections) {
            return Err(ConfigError(format!(
                "limits.max_connections must be within 1..={max_connections}, got {}",
                self.limits.max_connections
            )));
        }
        if !(1..=MAX_TOKENIZER_THREADS).contains(&self.limits.tokenizer_threads) {
            return Err(ConfigError(format!(
                "limits.tokenizer_threads must be within 1..={MAX_TOKENIZER_THREADS}, got {}",
                self.limits.tokenizer_threads
            )));
        }
        if !(1..=max_connections).contains(&self.limits.tokenizer_queue) {
            return Err(ConfigError(format!(
                "limits.tokenizer_queue must be within 1..={max_connections}, got {}",
                self.limits.tokenizer_queue
            )));
        }
        secs("health.interval_secs", self.health.interval_secs)?;
        secs("health.timeout_secs", self.health.timeout_secs)?;
        secs(
            "upstream.connect_timeout_secs",
            self.upstream.connect_timeout_secs,
        )?;
        secs(
            "upstream.first_byte_timeout_secs",
            self.upstream.first_byte_timeout_secs,
        )?;
        secs(
            "upstream.replay_timeout_secs",
            self.upstream.replay_timeout_secs,
        )?;
        secs(
            "upstream.event_heartbeat_timeout_secs",
            self.upstream.event_heartbeat_timeout_secs,
        )?;
        secs("upstream.event_poll_secs", self.upstream.event_poll_secs)?;
        secs(
            "upstream.event_poll_timeout_secs",
            self.upstream.event_poll_timeout_secs,
        )?;
        if !(self.upstream.event_heartbeat_secs.is_finite()
            && (0.0..=MAX_TIMEOUT_SECS).contains(&self.upstream.event_heartbeat_secs))
        {
            return Err(ConfigError(
                "upstream.event_heartbeat_secs must be within 0..=604800".into(),
            ));
        }
        if self.upstream.max_event_message_bytes < 1024 {
            return Err(ConfigError(
                "upstream.max_event_message_bytes must be >= 1024".into(),
            ));
        }
        let keys = self.auth.api_keys.iter().chain(&self.auth.admin_key);
        let keys = keys
            .chain(&self.upstream.api_key)
            .chain(self.workers.iter().filter_map(|w| w.api_key.as_ref()));
        for k in keys {
            if !k.is_valid() {
                return Err(ConfigError(
                    "keys must be 1 to 4096 printable ASCII characters without spaces".into(),
                ));
            }
        }
        if self.health.failures_to_remove == 0 {
            return Err(ConfigError("health.failures_to_remove must be >= 1".into()));
        }
        if self.limits.max_body_bytes == 0
            || self.limits.max_prompt_tokens == 0
            || self.limits.max_response_bytes == 0
        {
            return Err(ConfigError("limits must be > 0".into()));
        }
        Ok(())
    }
}

/// The URL of `endpoint` on the worker at `base`.
pub fn endpoint_url(base: &str, endpoint: Endpoint) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(base).map_err(|e| e.to_string())?;
    if url.host().is_none() {
        return Err("no host".into());
    }
    let path = format!("{}{}", url.path().trim_end_matches('/'), endpoint.path());
    url.set_path(&path);
    Ok(url)
}

#[cfg(test)]
mod tests;
