//! The endpoint picker (`kvroute epp`): kvroute behind a Gateway API gateway (Envoy and the
//! gateways built on it, through their `ext_proc` filter), picking the engine for each
//! request as the gateway's own routing does while the proxy carries the bytes.
//!
//! One gRPC stream per HTTP request (Envoy's `ExternalProcessor/Process`, request and
//! response bodies in `FULL_DUPLEX_STREAMED` mode, [`session`]): the request body is read
//! whole, parsed, tokenized, routed and booked exactly as the gateway routes (same
//! admission queue, same errors); the answer names the engine in the
//! `x-gateway-destination-endpoint` header and the `envoy.lb` dynamic metadata and gives the
//! body back. The response body streams through the same watch as the gateway's own proxy
//! (first token, usage, end), which releases the booking; so does the stream's end when the
//! client goes away. Refusals are answered by the picker itself: 503 when no worker is
//! eligible, 429 when shed, 4xx for a bad request. gRPC health (`grpc.health.v1`) is served
//! on a port of its own for probes and Envoy's health checks: serving while the picker is
//! (`engines` says whether an engine is up). Wire forms in [`wire`].

mod session;
pub mod wire;

use crate::gateway::Gateway;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic_health::ServingStatus;

pub use kvroute_fleet::config::EppConfig;

/// The gRPC service names the health port answers for, serving while the picker serves
/// (whether engines are up is answered request by request: 503 with `Retry-After`, which a
/// proxy marking the picker down would turn into its own 500).
pub const HEALTH_SERVICES: [&str; 4] = ["", "liveness", "readiness", wire::EXT_PROC_SERVICE];

/// The health service name that says whether an engine is up (for dashboards and probes
/// that want it; not the picker's readiness).
pub const ENGINES_SERVICE: &str = "engines";

/// Messages kept while one is being handled (Envoy sends none before an answer in the
/// modes the picker takes; a peer that floods is cut off).
const MAX_HELD: usize = 64;

/// A running picker.
pub struct EppHandle {
    /// The `ext_proc` address.
    pub addr: SocketAddr,
    /// The health address.
    pub health_addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    /// The two servers: they stop gracefully on `stop`.
    servers: tokio_util::task::TaskTracker,
    /// The health reporter: ended at once on `stop`.
    reporter: kvroute_fleet::tasks::Tasks,
}

impl EppHandle {
    /// Stops serving: no new connection or stream is taken (HTTP/2 GOAWAY), the requests
    /// in flight finish.
    pub fn stop(&self) {
        self.stop.send_replace(true);
        self.reporter.stop();
    }

    /// Waits until both servers have stopped (after [`EppHandle::stop`]).
    pub async fn wait(self) {
        self.servers.close();
        self.servers.wait().await;
    }
}

impl Drop for EppHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves the picker for `gw`: `ext_proc` on `grpc`, health on `health`.
pub async fn spawn(
    gw: Arc<Gateway>,
    grpc: tokio::net::TcpListener,
    health: tokio::net::TcpListener,
) -> std::io::Result<EppHandle> {
    let (addr, health_addr) = (grpc.local_addr()?, health.local_addr()?);
    let (reporter, health_service) = tonic_health::server::health_reporter();
    for name in HEALTH_SERVICES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let picker = Picker {
        gw: gw.clone(),
        streams: Arc::new(tokio::sync::Semaphore::new(
            gw.config().epp.max_streams.max(1),
        )),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signal = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc_server = tonic::transport::Server::builder()
        .add_service(ExternalProcessorServer::new(picker))
        .add_service(health_service.clone())
        .serve_with_incoming_shutdown(no_delay(grpc), signal(stopped.clone()));
    let health_server = tonic::transport::Server::builder()
        .add_service(health_service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(health), signal(stopped));
    let servers = tokio_util::task::TaskTracker::new();
    servers.spawn(async move {
        if let Err(e) = grpc_server.await {
            tracing::error!(error = %e, "endpoint picker: the ext_proc server stopped");
        }
    });
    servers.spawn(async move {
        if let Err(e) = health_server.await {
            tracing::error!(error = %e, "endpoint picker: the health server stopped");
        }
    });
    let health_reporter = kvroute_fleet::tasks::Tasks::new();
    health_reporter.spawn(report_health(gw, reporter));
    tracing::info!(%addr, %health_addr, "endpoint picker listening (ext_proc, grpc health)");
    Ok(EppHandle {
        addr,
        health_addr,
        stop,
        servers,
        reporter: health_reporter,
    })
}

/// The connections of `listener` with Nagle's algorithm off: the picker's answers are small
/// messages, and held back for the peer's delayed ACK each waited 40 ms (measured with
/// `bench/epp-overhead.sh` before this).
fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures_util::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        if let Err(e) = conn.set_nodelay(true) {
            tracing::debug!(error = %e, "endpoint picker: TCP_NODELAY not set");
        }
        Ok(conn)
    })
}

/// Keeps [`ENGINES_SERVICE`] in step with the fleet: serving while a worker is up.
async fn report_health(gw: Arc<Gateway>, reporter: tonic_health::server::HealthReporter) {
    let mut last = None;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let up = gw.registry.up_count() > 0;
        if last != Some(up) {
            let status = if up {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(ENGINES_SERVICE, status).await;
            last = Some(up);
        }
    }
}

/// The `ext_proc` service.
struct Picker {
    gw: Arc<Gateway>,
    streams: Arc<tokio::sync::Semaphore>,
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, tonic::Status>>;

    async fn process(
        &self,
        request: tonic::Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let gw = self.gw.clone();
        let permit = self.streams.clone().try_acquire_owned();
        tokio::spawn(async move {
            let Ok(_permit) = permit else {
                gw.metrics.epp_streams.with_label_values(&["refused"]).inc();
                let _ = tx.send(Ok(wire::too_many_streams())).await;
                return;
            };
            let mut s = session::Session::new(gw);
            // Messages that came while one was being handled, in order.
            let mut held = std::collections::VecDeque::new();
            'stream: loop {
                let msg = match held.pop_front() {
                    Some(m) => m,
                    None => match tokio::select! {
                        m = inbound.message() => m,
                        () = tx.closed() => break,
                    } {
                        Ok(Some(m)) => m,
                        // Envoy ended the stream (the request is over, or its client left).
                        Ok(None) | Err(_) => break,
                    },
                };
                // Routing may wait in the admission queue: the client leaving meanwhile
                // (Envoy resets the stream, or half-closes it) takes the request out (the
                // routing future is dropped with its place in the queue).
                let mut open = true;
                let out = {
                    let handling = s.on(msg);
                    tokio::pin!(handling);
                    loop {
                        tokio::select! {
                            out = &mut handling => break out,
                            () = tx.closed() => break 'stream,
                            m = inbound.message(), if open => match m {
                                Ok(Some(m)) if held.len() < MAX_HELD => held.push_back(m),
                                // A flood, or the stream broken: the request is over.
                                Ok(Some(_)) | Err(_) => break 'stream,
                                // Envoy sends no more: this message is still answered,
                                // then the stream ends (a booking made meanwhile is
                                // released with the session).
                                Ok(None) => open = false,
                            },
                        }
                    }
                };
                for r in out {
                    if tx.send(Ok(r)).await.is_err() {
                        return;
                    }
                }
                if s.is_over() || (!open && held.is_empty()) {
                    break;
                }
            }
            // The session drops here: a booking still held is released, an unfinished
            // answer counted as the client's leaving.
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}
