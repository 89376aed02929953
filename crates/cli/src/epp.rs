//! `kvroute epp`: the gateway as the endpoint picker of a Gateway API gateway (Envoy's
//! `ext_proc`): the same config and flags as `kvroute serve`, plus the picker's ports. The
//! HTTP port keeps serving metrics, `/ready`, `/live` and the debug views (and the OpenAI
//! API, for direct use).

use crate::serve::ServeArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::collections::BTreeMap;

/// Options of `kvroute epp`.
#[derive(Args, Debug, Default)]
pub struct EppArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The ext_proc gRPC port (default 9002).
    #[arg(long)]
    pub grpc_port: Option<u16>,
    /// The gRPC health port (default 9003).
    #[arg(long)]
    pub grpc_health_port: Option<u16>,
    /// The InferencePool whose endpoints to pick among (its selector and target port, read
    /// from the API server); the Pods are watched as `[discovery.kubernetes]` does.
    #[arg(long)]
    pub pool_name: Option<String>,
    /// The InferencePool's namespace (default: `NAMESPACE` when set, else the picker's own:
    /// its service account's).
    #[arg(long)]
    pub pool_namespace: Option<String>,
}

impl EppArgs {
    /// The config file (if any) with the flags applied.
    pub fn config(&self) -> Result<kvroute_gateway::GatewayConfig> {
        let mut c = self.serve.unchecked_config()?;
        if let Some(p) = self.grpc_port {
            c.epp.port = p;
        }
        if let Some(p) = self.grpc_health_port {
            c.epp.health_port = p;
        }
        if let Some(pool) = &self.pool_name {
            let namespace = self
                .pool_namespace
                .clone()
                .or_else(|| std::env::var("NAMESPACE").ok())
                .unwrap_or_default();
            let k = c.discovery.kubernetes.get_or_insert_with(Default::default);
            k.namespace = namespace;
            k.inference_pool = Some(pool.clone());
        }
        c.validate()?;
        Ok(c)
    }
}

/// Runs the picker until Ctrl-C or SIGTERM.
pub fn run(args: &EppArgs) -> Result<()> {
    let config = args.config()?;
    if args.serve.print_config {
        return crate::serve::print_config(&config);
    }
    if config.has_pools() {
        anyhow::bail!(
            "the endpoint picker serves one pool (an InferencePool): give it one pool's \
             settings at the top level, not [[pools]]"
        );
    }
    let pre = kvroute_gateway::load_preprocessor(&config)?;
    crate::runtime()?.block_on(async move {
        let bind = |port: u16| {
            let addr = format!("{}:{port}", config.host);
            async move {
                tokio::net::TcpListener::bind(&addr)
                    .await
                    .with_context(|| format!("listening on {addr}"))
            }
        };
        let http = bind(config.port).await?;
        let grpc = bind(config.epp.port).await?;
        let health = bind(config.epp.health_port).await?;
        let handle = kvroute_gateway::spawn(config, pre, http, BTreeMap::new()).await?;
        let epp = kvroute_gateway::epp::spawn(handle.state().clone(), grpc, health).await?;
        let reload = crate::serve::Reloader::new(&args.serve.config);
        println!(
            "kvroute endpoint picker: ext_proc on {}, health on {}, metrics on {}/metrics",
            epp.addr,
            epp.health_addr,
            handle.url()
        );
        tokio::select! {
            r = crate::stop_signal() => r?,
            () = reload.run(&handle, || args.config()) => {}
        }
        println!("stopping");
        epp.stop();
        epp.wait().await;
        handle.shutdown().await;
        Ok(())
    })
}
