//! Serving an axum app under limits on what clients can hold open (the gateway, the worker,
//! the dashboard): a deadline for each request's headers, which also ends idle keep-alive
//! connections (hyper starts the clock when it waits for the next request); a cap on open
//! connections, beyond which a few more are answered `503 too_many_connections` (`/live`
//! still `200`) and closed, and any further ones closed at once, so a flood of sockets can
//! neither use up the process's file descriptors nor lock out its liveness probe;
//! `TCP_NODELAY` on every connection; TLS when given a setup (the handshake under the same
//! deadline as the headers); a bounded graceful shutdown.

use crate::tls::Tls;
use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kvroute_protocol::openai::http::error_response;
use kvroute_protocol::openai::ApiError;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Connections served past `max_connections` with a `503` and closed (then: closed at once).
pub const OVERFLOW_CONNECTIONS: usize = 64;

/// What clients may hold.
#[derive(Clone, Copy, Debug)]
pub struct ServeLimits {
    /// Longest time to receive a request's headers, counted from when the connection is
    /// ready for a request (so also the longest idle keep-alive gap).
    pub header_read_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Longest wait for open connections to finish at shutdown.
    pub shutdown_timeout: Duration,
}

impl Default for ServeLimits {
    /// 30 s for headers (and idle keep-alive), 4,096 connections, 30 s to finish at shutdown.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 4_096,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// How long a client may take to send a request body, unless configured (the timeout given
/// to `kvroute_protocol::openai::http::read_body`).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` completes, then lets
/// open connections finish (for at most `limits.shutdown_timeout`).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ServeLimits,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send,
) {
    // Permits are what the shutdown waits for: every connection holds one until it ends.
    let max = limits.max_connections.clamp(1, MAX_CONNECTIONS);
    let served = Arc::new(Semaphore::new(max));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let (stop, stopping) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut closing = builder.clone();
    closing.keep_alive(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors or a connection reset before it was taken:
                    // wait a moment instead of spinning on the same error.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // A connection that cannot take the option still works, only with Nagle's delays (a
        // stream writes one small chunk per token).
        let _ = stream.set_nodelay(true);
        let (permit, over) = if let Ok(permit) = served.clone().try_acquire_owned() {
            (permit, false)
        } else if let Ok(permit) = overflow.clone().try_acquire_owned() {
            tracing::warn!(
                max_connections = max,
                "connection limit reached: answering 503"
            );
            (permit, true)
        } else {
            // Dropped unread: the client sees the connection closed.
            continue;
        };
        let (builder, stopping) = (
            if over { &closing } else { &builder }.clone(),
            stopping.clone(),
        );
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return connection(TokioIo::new(stream), builder, app, over, permit, stopping)
                    .await;
            };
            let handshake = tls.acceptor().accept(stream);
            match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                Ok(Ok(stream)) => {
                    connection(TokioIo::new(stream), builder, app, over, permit, stopping).await;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake not done within the header deadline"),
            }
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let all_closed = async {
        // Every permit back means every connection ended (upgraded ones included).
        let _ = served.acquire_many(permits(max)).await;
        let _ = overflow.acquire_many(permits(OVERFLOW_CONNECTIONS)).await;
    };
    if tokio::time::timeout(limits.shutdown_timeout, all_closed)
        .await
        .is_err()
    {
        tracing::warn!(
            secs = limits.shutdown_timeout.as_secs_f64(),
            "connections still open at the end of the shutdown wait: dropped"
        );
    }
}

/// The largest connection cap [`serve`] takes (more is served as this many).
pub const MAX_CONNECTIONS: usize = 1 << 20;

fn permits(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Serves one connection with `app` (or, `over` the limit, the answer that refuses it).
async fn connection<I>(
    io: I,
    builder: http1::Builder,
    app: axum::Router,
    over: bool,
    permit: OwnedSemaphorePermit,
    stopping: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    if over {
        let service = hyper::service::service_fn(over_the_limit);
        drive(
            builder.serve_connection(io, service).with_upgrades(),
            permit,
            stopping,
        )
        .await;
    } else {
        let service = TowerToHyperService::new(app);
        drive(
            builder.serve_connection(io, service).with_upgrades(),
            permit,
            stopping,
        )
        .await;
    }
}

/// Serves one connection (and what it is upgraded to, a WebSocket) to its end, asking it to
/// finish its request in progress and close once the server stops; the permit is held until
/// then.
async fn drive<I, S, B>(
    conn: http1::UpgradeableConnection<I, S>,
    permit: OwnedSemaphorePermit,
    mut stopping: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        // Sent once, at shutdown (or the server dropped: the same).
        _ = stopping.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
    drop(permit);
}

/// The answer on a connection past the limit: `/live` is alive, everything else is refused.
async fn over_the_limit(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(if req.uri().path() == "/live" {
        Response::new(Body::from("ok"))
    } else {
        error_response(&ApiError::unavailable(
            "too_many_connections",
            "the server holds as many connections as it is allowed: retry later",
            1,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(
        limits: ServeLimits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/live", axum::routing::get(|| async { "live" }))
            .route("/x", axum::routing::get(|| async { "x" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, app, limits, None, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    /// Sends a GET of `path` on a new connection and reads the answer to its end.
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_client_slow_with_its_headers_or_idle_is_cut_off() {
        let limits = ServeLimits {
            header_read_timeout: Duration::from_millis(300),
            ..ServeLimits::default()
        };
        let (addr, _stop) = start(limits).await;
        for partial in ["GET /x HTTP/1.1\r\nhost: x\r\n", ""] {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(partial.as_bytes()).await.unwrap();
            let mut buf = Vec::new();
            // Closed by the server (with a 408 for a started request, or nothing) long before
            // the test's own bound.
            let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf)).await;
            assert!(read.is_ok(), "still open after 10 s with {partial:?}");
        }
        assert!(get(addr, "/x").await.ends_with("x"));
    }

    #[tokio::test]
    async fn past_the_connection_limit_live_answers_and_the_rest_is_refused() {
        let limits = ServeLimits {
            max_connections: 2,
            ..ServeLimits::default()
        };
        let (addr, stop) = start(limits).await;
        // Two idle connections hold every slot.
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Accepted in order: give the server a moment to take both.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let live = get(addr, "/live").await;
        assert!(live.starts_with("HTTP/1.1 200"), "{live}");
        let refused = get(addr, "/x").await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("too_many_connections"), "{refused}");
        assert!(
            refused.to_ascii_lowercase().contains("retry-after: 1"),
            "{refused}"
        );
        // A slot freed: served again.
        held.pop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(get(addr, "/x").await.starts_with("HTTP/1.1 200"));
        // Shutdown ends the server although a connection is still open.
        drop(stop);
    }
}
