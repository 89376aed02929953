//! Many models behind one gateway: `[[pools]]`, each a model (its served names and
//! adapters) with its own tokenizer, routing core (block size, policy, objectives,
//! admission), workers and discovery sources. A pool's settings are the top level's with the
//! pool's own on top (its `router` and `discovery` tables merged key by key, arrays
//! replaced); everything else (listener, limits, health, upstream, auth, plane) is shared.
//! The top level's discovery sources are shared too: each engine they find joins the pool
//! serving its model ([`GatewayConfig::shared_discovery`]).
//! Without `[[pools]]` the top level describes the one pool.

use super::{ConfigError, DiscoveryConfig, GatewayConfig, WorkerSpec};
use serde::{Deserialize, Serialize};

/// The most pools one gateway serves.
pub const MAX_POOLS: usize = 64;

/// One model's pool (`[[pools]]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Its name: the `model` label of its metrics, the `model` parameter of `/debug/*`.
    /// None: its first served name.
    pub name: Option<String>,
    /// The model names it serves (at least one).
    pub models: Vec<String>,
    /// Its LoRA adapters (besides those its workers list).
    pub lora_adapters: Vec<String>,
    /// Its tokenizer (as the top-level `tokenizer`); None: the top level's.
    pub tokenizer: Option<String>,
    /// Its routing core: keys here override the top-level `[router]`'s (tables merged, an
    /// array replaced whole).
    pub router: Option<toml::Table>,
    /// Its engines.
    pub workers: Vec<WorkerSpec>,
    /// Its workers' batch limit where they give none; None: the top level's.
    #[serde(alias = "max_num_seqs")]
    pub max_batch: Option<u32>,
    /// Where its own workers are found while running: its sources, and settings over the
    /// top-level `[discovery]`'s (whose sources are shared between the pools, not copied
    /// into each).
    pub discovery: Option<toml::Table>,
}

/// A pool's name and its whole settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Its name (see [`PoolConfig::name`]); empty for the one pool of a config without
    /// `[[pools]]`.
    pub name: String,
    /// Its settings: the top level's with its own on top, `pools` empty.
    pub config: GatewayConfig,
}

impl GatewayConfig {
    /// Whether it describes several models (`[[pools]]`).
    pub fn has_pools(&self) -> bool {
        !self.pools.is_empty()
    }

    /// Each pool's settings, in order: the config itself (name empty) when it has no
    /// `[[pools]]`. Errors name the pool and the key.
    pub fn pools(&self) -> Result<Vec<Pool>, ConfigError> {
        if self.pools.is_empty() {
            return Ok(vec![Pool {
                name: String::new(),
                config: self.clone(),
            }]);
        }
        if self.pools.len() > MAX_POOLS {
            return Err(ConfigError(format!(
                "at most {MAX_POOLS} pools, got {}",
                self.pools.len()
            )));
        }
        for (key, given) in [
            ("models", !self.models.is_empty()),
            ("lora_adapters", !self.lora_adapters.is_empty()),
            ("workers", !self.workers.is_empty()),
        ] {
            if given {
                return Err(ConfigError(format!(
                    "{key} go in each of [[pools]], not at the top level, when pools are given"
                )));
            }
        }
        let mut base = self.clone();
        base.pools.clear();
        // The top level's sources are shared between the pools (each engine joining the pool
        // of its model): a pool's own discovery starts from the settings without them.
        base.discovery.file = None;
        base.discovery.dns.clear();
        base.discovery.kubernetes = None;
        let shared = self.discovery.enabled();
        let mut out: Vec<Pool> = Vec::with_capacity(self.pools.len());
        let mut served = std::collections::BTreeMap::new();
        for (i, p) in self.pools.iter().enumerate() {
            let at = |e: String| ConfigError(format!("pools[{i}]: {e}"));
            let Some(first) = p.models.first() else {
                return Err(at("models: a pool serves at least one model".into()));
            };
            let name = p.name.clone().unwrap_or_else(|| first.clone());
            if !super::is_name(&name) {
                return Err(at(format!(
                    "name: 1 to 256 characters without control characters, got {name:?}"
                )));
            }
            if out.iter().any(|o| o.name == name) {
                return Err(at(format!("name: two pools are named {name:?}")));
            }
            for m in p.models.iter().chain(&p.lora_adapters) {
                if let Some(other) = served.insert(m.clone(), name.clone()) {
                    return Err(at(format!(
                        "{m:?} is served by pool {other:?} too: a model name picks one pool"
                    )));
                }
            }
            let mut config = base.clone();
            config.models = p.models.clone();
            config.lora_adapters = p.lora_adapters.clone();
            config.workers = p.workers.clone();
            if p.tokenizer.is_some() {
                config.tokenizer = p.tokenizer.clone();
            }
            if p.max_batch.is_some() {
                config.max_batch = p.max_batch;
            }
            if let Some(t) = &p.router {
                let flow = config.router.admission.flow.clone();
                config.router = merged(&config.router, t).map_err(|e| at(format!("router.{e}")))?;
                // Tenants' keys are never serialized: the top level's stay unless the pool
                // gives its own tenants and classes.
                let own_flow = t
                    .get("admission")
                    .and_then(|a| a.as_table())
                    .is_some_and(|a| a.contains_key("flow"));
                if !own_flow {
                    config.router.admission.flow = flow;
                }
            }
            if let Some(t) = &p.discovery {
                config.discovery = merged::<DiscoveryConfig>(&config.discovery, t)
                    .map_err(|e| at(format!("discovery.{e}")))?;
            }
            config
                .validate_pool(!shared)
                .map_err(|e| at(e.0.trim_start_matches("invalid gateway config: ").into()))?;
            if let Some(w) =
                (p.workers.iter()).find(|w| w.model.as_ref().is_some_and(|m| !p.models.contains(m)))
            {
                return Err(at(format!(
                    "workers: {} names model {:?}, which this pool does not serve",
                    w.url,
                    w.model.as_deref().unwrap_or_default()
                )));
            }
            out.push(Pool { name, config });
        }
        Ok(out)
    }
}

impl GatewayConfig {
    /// With `[[pools]]`, the top-level discovery sources, shared between the pools: each
    /// engine they find joins the pool serving its model (its source's `model`, else what its
    /// `/v1/models` lists). None without pools or sources.
    pub fn shared_discovery(&self) -> Option<DiscoveryConfig> {
        (self.has_pools() && self.discovery.enabled()).then(|| self.discovery.clone())
    }

    /// The config as `check-config` and `--print-config` show it: each pool written out
    /// whole (its name, tokenizer and batch limit filled in, its `router` and `discovery`
    /// tables complete), so that what every pool runs with is on the page.
    pub fn with_pools_written_out(&self) -> Result<GatewayConfig, ConfigError> {
        let mut out = self.clone();
        if !self.has_pools() {
            return Ok(out);
        }
        let table = |what: &str, r: Result<toml::Table, toml::ser::Error>| {
            r.map_err(|e| ConfigError(format!("writing {what}: {e}")))
        };
        for (p, pool) in out.pools.iter_mut().zip(self.pools()?) {
            p.name = Some(pool.name);
            p.tokenizer = pool.config.tokenizer;
            p.max_batch = pool.config.max_batch;
            p.router = Some(table("router", toml::Table::try_from(&pool.config.router))?);
            p.discovery = Some(table(
                "discovery",
                toml::Table::try_from(&pool.config.discovery),
            )?);
        }
        Ok(out)
    }
}

/// `base` with the keys of `over` on top (tables merged, other values replaced), read back.
fn merged<T: Serialize + serde::de::DeserializeOwned>(
    base: &T,
    over: &toml::Table,
) -> Result<T, String> {
    let mut tree = toml::Table::try_from(base).map_err(|e| e.to_string())?;
    merge(&mut tree, over);
    serde_path_to_error::deserialize(toml::Value::Table(tree))
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

fn merge(into: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (into.get_mut(k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> GatewayConfig {
        GatewayConfig::from_toml(
            r#"
            [router]
            block_size = 16
            policy = { kind = "goodput" }
            [[pools]]
            models = ["small"]
            tokenizer = "builtin"
            workers = [{ url = "http://127.0.0.1:9001" }]
            [[pools]]
            name = "big-pool"
            models = ["big", "big-alias"]
            router = { block_size = 32 }
            workers = [{ url = "http://127.0.0.1:9002" }]
            "#,
        )
        .expect("parses")
    }

    #[test]
    fn a_pool_takes_the_top_level_settings_with_its_own_on_top() {
        let pools = two().pools().expect("valid");
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].name, "small");
        assert_eq!(pools[0].config.router.block_size, 16);
        assert_eq!(pools[0].config.tokenizer.as_deref(), Some("builtin"));
        assert_eq!(pools[1].name, "big-pool");
        assert_eq!(pools[1].config.router.block_size, 32);
        assert_eq!(pools[1].config.models, ["big", "big-alias"]);
        assert_eq!(pools[1].config.tokenizer, None);
        assert_eq!(pools[1].config.workers.len(), 1);
        assert!(pools.iter().all(|p| p.config.pools.is_empty()));
        assert!(two().validate().is_ok());
    }

    #[test]
    fn written_out_each_pool_shows_its_whole_settings_and_reads_back_the_same() {
        let c = two();
        let out = c.with_pools_written_out().expect("valid");
        let big = &out.pools[1];
        assert_eq!(big.name.as_deref(), Some("big-pool"));
        let router = big.router.as_ref().expect("router");
        assert_eq!(router["block_size"].as_integer(), Some(32));
        assert_eq!(router["policy"]["kind"].as_str(), Some("goodput"));
        assert_eq!(out.pools[0].name.as_deref(), Some("small"));
        let text = toml::to_string(&out).expect("writes");
        let back = GatewayConfig::from_toml(&text).expect("reads");
        let (a, b) = (c.pools().expect("pools"), back.pools().expect("pools"));
        assert_eq!(a, b, "the same pools");
    }

    #[test]
    fn without_pools_the_config_is_its_one_pool() {
        let c = GatewayConfig {
            workers: vec![WorkerSpec::parse("http://127.0.0.1:9").expect("worker")],
            ..GatewayConfig::default()
        };
        let pools = c.pools().expect("valid");
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].name, "");
        assert_eq!(pools[0].config, c);
    }

    #[test]
    fn bad_pools_are_refused_with_where() {
        let err = |c: GatewayConfig| c.pools().expect_err("refused").0;
        let mut c = two();
        c.pools[1].models = vec!["small".into()];
        assert!(err(c).contains("pools[1]: \"small\" is served by pool \"small\""));
        let mut c = two();
        c.pools[0].models.clear();
        assert!(err(c).contains("pools[0]: models"));
        let mut c = two();
        c.pools[1].name = Some("small".into());
        assert!(err(c).contains("two pools are named"));
        let mut c = two();
        c.models = vec!["x".into()];
        assert!(err(c).contains("models go in each of [[pools]]"));
        let mut c = two();
        c.pools[1].router = Some(toml::from_str("block_size = 0").expect("toml"));
        let e = err(c.clone());
        assert!(e.starts_with("pools[1]: "), "{e}");
        assert!(c.validate().is_err());
        let mut c = two();
        c.pools[1].router = Some(toml::from_str("blok_size = 3").expect("toml"));
        assert!(err(c).contains("pools[1]: router."), "unknown key");
        let mut c = two();
        c.pools[0].workers.clear();
        assert!(err(c).contains("pools[0]: at least one worker"));
    }

    #[test]
    fn top_level_sources_are_shared_and_not_copied_into_each_pool() {
        let c = GatewayConfig::from_toml(
            r#"
            [discovery]
            file = "/etc/kvroute/workers.toml"
            interval_secs = 5.0
            [[pools]]
            models = ["small"]
            [[pools]]
            models = ["big"]
            discovery = { dns = [{ name = "big.svc", port = 8000 }] }
            "#,
        )
        .expect("parses");
        let pools = c.pools().expect("pools without workers of their own");
        assert!(!pools[0].config.discovery.enabled(), "not the shared file");
        assert_eq!(pools[0].config.discovery.interval_secs, 5.0, "its settings");
        assert_eq!(pools[1].config.discovery.dns.len(), 1, "its own source");
        assert_eq!(pools[1].config.discovery.file, None);
        let shared = c.shared_discovery().expect("shared");
        assert!(shared.file.is_some());
        assert_eq!(two().shared_discovery(), None);
        // Without shared sources a pool needs workers or sources of its own.
        let mut alone = c.clone();
        alone.discovery.file = None;
        assert!(alone
            .pools()
            .expect_err("refused")
            .0
            .contains("pools[0]: at least one worker"));
        // A pool's own worker naming another pool's model.
        let mut c = two();
        c.pools[0].workers[0].model = Some("big".into());
        let e = c.pools().expect_err("refused").0;
        assert!(
            e.contains("pools[0]: workers: http://127.0.0.1:9001 names model \"big\""),
            "{e}"
        );
    }
}
