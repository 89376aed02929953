//! Data-parallel ranks: an engine with `dp_size` N > 1 is N workers for the router, one per
//! rank, because each rank keeps a KV cache of its own. vLLM and SGLang publish rank R's
//! events on the configured event (and replay) port plus R, tag its batches with the rank,
//! and serve it a request that carries `X-Data-Parallel-Rank: R`.

use super::{ConfigError, GatewayConfig, WorkerSpec};

/// The most ranks one engine may have.
pub const MAX_DP_SIZE: u32 = 1024;

/// Checks a worker's `dp_size` against its endpoints.
pub(super) fn validate(w: &WorkerSpec) -> Result<(), ConfigError> {
    let Some(n) = w.dp_size else {
        return Ok(());
    };
    if !(1..=MAX_DP_SIZE).contains(&n) {
        return Err(ConfigError(format!(
            "worker {}: dp_size must be 1 to {MAX_DP_SIZE}, got {n}",
            w.url
        )));
    }
    if w.dp_rank.is_some() {
        return Ok(());
    }
    let events = w.event_socket().map(|(ep, _)| ep);
    for ep in [events, w.replay.as_deref()].into_iter().flatten() {
        if offset_port(ep, n - 1).is_none() {
            return Err(ConfigError(format!(
                "worker {}: {ep:?} plus {} ranks passes port 65535",
                w.url,
                n - 1
            )));
        }
    }
    Ok(())
}

/// `tcp://host:port` with the port moved up by `rank` (None when it is not that form or
/// passes 65535).
pub fn offset_port(endpoint: &str, rank: u32) -> Option<String> {
    let (base, port) = endpoint.rsplit_once(':')?;
    let port = u32::from(port.parse::<u16>().ok()?) + rank;
    let port = u16::try_from(port).ok()?;
    Some(format!("{base}:{port}"))
}

/// One worker per rank of every engine with `dp_size` > 1, in order, each named
/// `NAME/dpR`, with its rank's event and replay endpoints; other workers as they are.
pub fn expand(workers: &[WorkerSpec]) -> Vec<WorkerSpec> {
    let mut out = Vec::with_capacity(workers.len());
    for w in workers {
        let n = w.dp_size.unwrap_or(1);
        if n <= 1 || w.dp_rank.is_some() {
            out.push(w.clone());
            continue;
        }
        let name = w.display_name();
        for r in 0..n {
            let shift = |ep: &str| offset_port(ep, r).unwrap_or_else(|| ep.to_string());
            let events = match (w.event_poll_url(), w.event_socket()) {
                (Some(_), _) | (None, None) => w.events.clone(),
                (None, Some((ep, true))) => Some(format!("bind:{}", shift(ep))),
                (None, Some((ep, false))) => Some(shift(ep)),
            };
            out.push(WorkerSpec {
                name: Some(format!("{name}/dp{r}")),
                events,
                replay: w.replay.as_deref().map(shift),
                dp_rank: Some(r),
                ..w.clone()
            });
        }
    }
    out
}

impl GatewayConfig {
    /// The same settings with every data-parallel engine expanded into its ranks
    /// ([`expand`]); the gateway runs on this form.
    pub fn with_ranks_expanded(mut self) -> Self {
        self.workers = expand(&self.workers);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_move_up_by_the_rank_and_stop_at_65535() {
        assert_eq!(offset_port("tcp://h:5557", 0).unwrap(), "tcp://h:5557");
        assert_eq!(offset_port("tcp://h:5557", 3).unwrap(), "tcp://h:5560");
        assert_eq!(offset_port("tcp://*:65535", 0).unwrap(), "tcp://*:65535");
        assert_eq!(offset_port("tcp://*:65535", 1), None);
        assert_eq!(offset_port("tcp://h", 1), None);
    }

    #[test]
    fn an_engine_with_ranks_becomes_one_worker_per_rank() {
        let w = WorkerSpec::parse("http://h:8000=bind:tcp://*:5557=tcp://h:5657,dp=3").unwrap();
        assert_eq!(w.dp_size, Some(3));
        let plain = WorkerSpec::parse("http://g:8000=tcp://g:5557").unwrap();
        let all = expand(&[w, plain.clone()]);
        assert_eq!(all.len(), 4);
        let names: Vec<String> = all.iter().map(WorkerSpec::display_name).collect();
        assert_eq!(names, ["h:8000/dp0", "h:8000/dp1", "h:8000/dp2", "g:8000"]);
        assert_eq!(all[2].events.as_deref(), Some("bind:tcp://*:5559"));
        assert_eq!(all[2].replay.as_deref(), Some("tcp://h:5659"));
        assert_eq!(all[2].dp_rank, Some(2));
        assert_eq!(all[2].url, "http://h:8000");
        assert_eq!(all[3], plain);
        // Expanding twice changes nothing; so does dp=1.
        assert_eq!(expand(&all), all);
        let one = WorkerSpec::parse("http://h:1,dp=1").unwrap();
        assert_eq!(expand(std::slice::from_ref(&one)), vec![one]);
    }

    #[test]
    fn a_pull_api_is_shared_by_the_ranks() {
        let w = WorkerSpec::parse("http://h:8000=poll,dp=2").unwrap();
        let all = expand(&[w]);
        assert!(all.iter().all(|w| w.events.as_deref() == Some("poll")));
        assert_eq!(
            all[1].event_poll_url().unwrap(),
            "http://h:8000/kv_cache_events"
        );
    }

    #[test]
    fn bad_rank_counts_are_refused() {
        for bad in [
            "http://h:1,dp=0",
            "http://h:1,dp=x",
            "http://h:1,dp=5000",
            "http://h:1=tcp://h:65535,dp=2",
            "http://h:1=tcp://h:5557=tcp://h:65534,dp=3",
        ] {
            assert!(WorkerSpec::parse(bad).is_err(), "{bad}");
        }
        let mut c = GatewayConfig::from_toml(
            r#"
            [[workers]]
            url = "http://h:8000"
            events = "tcp://h:5557"
            dp_size = 2
            "#,
        )
        .unwrap();
        c.models = vec!["m".into()];
        c.validate().unwrap();
        let c = c.with_ranks_expanded();
        assert_eq!(c.workers.len(), 2);
        c.validate().unwrap();
    }
}
