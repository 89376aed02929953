//! A routing decision laid open for the client that asks for it: a request with
//! `x-kvroute-explain: 1` gets, in the `x-kvroute-route` response header, the router's
//! [`Explanation`] of that very decision (the same evaluation that chose the worker, not a
//! second look) as compact JSON with worker names: per worker the matched blocks, the blocks
//! it can load back from host memory and disk (only when there are any), the uncached tokens, the load terms, the policy's cost and which one won. The dashboard's
//! conversation page shows it per turn. `/debug/explain` names workers the same way.

use crate::gateway::Gateway;
use axum::http::HeaderValue;
use kvroute_core::Explanation;
use serde::Serialize;

/// The request header that asks for the explanation (any value but `0`).
pub const EXPLAIN_HEADER: &str = "x-kvroute-explain";
/// The response header that carries it.
pub const ROUTE_HEADER: &str = "x-kvroute-route";
/// Most workers listed: the chosen one, then the cheapest.
pub const MAX_EXPLAINED_WORKERS: usize = 16;

#[derive(Serialize)]
struct Route<'a> {
    policy: &'a str,
    prompt_tokens: usize,
    block_size: usize,
    /// Workers not listed (beyond [`MAX_EXPLAINED_WORKERS`]).
    omitted: usize,
    workers: Vec<Terms<'a>>,
}

#[derive(Serialize)]
struct Terms<'a> {
    name: &'a str,
    matched_blocks: usize,
    #[serde(skip_serializing_if = "is_zero")]
    host_blocks: usize,
    #[serde(skip_serializing_if = "is_zero")]
    disk_blocks: usize,
    uncached_tokens: usize,
    inflight: u32,
    prefill_tokens: u64,
    busy: bool,
    eligible: bool,
    cost: Option<f64>,
    chosen: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Whether a request's headers ask for the explanation.
pub fn asked(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(EXPLAIN_HEADER)
        .is_some_and(|v| v.as_bytes() != b"0")
}

/// The header value for `ex`; None when it cannot be one (a name that is not visible ASCII).
pub fn header_value(gw: &Gateway, ex: &Explanation) -> Option<HeaderValue> {
    let mut order: Vec<usize> = (0..ex.workers.len()).collect();
    // The winner first, then eligible workers by cost, then the rest, each by id.
    order.sort_by(|&a, &b| {
        let (x, y) = (&ex.workers[a], &ex.workers[b]);
        y.chosen
            .cmp(&x.chosen)
            .then(y.eligible.cmp(&x.eligible))
            .then(
                x.cost
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&y.cost.unwrap_or(f64::INFINITY)),
            )
            .then(x.worker.cmp(&y.worker))
    });
    let listed = order.len().min(MAX_EXPLAINED_WORKERS);
    let names: Vec<String> = order[..listed]
        .iter()
        .map(|&i| name_of(gw, ex.workers[i].worker))
        .collect();
    let workers = order[..listed]
        .iter()
        .zip(&names)
        .map(|(&i, name)| {
            let w = &ex.workers[i];
            Terms {
                name,
                matched_blocks: w.matched_blocks,
                host_blocks: w.loadable.host,
                disk_blocks: w.loadable.disk,
                uncached_tokens: w.uncached_tokens,
                inflight: w.inflight,
                prefill_tokens: w.prefill_tokens,
                busy: w.busy,
                eligible: w.eligible,
                cost: w.cost.filter(|c| c.is_finite()),
                chosen: w.chosen,
            }
        })
        .collect();
    let route = Route {
        policy: &ex.policy,
        prompt_tokens: ex.prompt_tokens,
        block_size: ex.block_size,
        omitted: order.len() - listed,
        workers,
    };
    let json = serde_json::to_string(&route).ok()?;
    HeaderValue::from_str(&json).ok()
}

/// The name users know worker `id` by (its number when it has left the fleet).
fn name_of(gw: &Gateway, id: kvroute_core::WorkerId) -> String {
    gw.registry
        .get(id)
        .map_or_else(|| id.to_string(), |w| w.name.clone())
}

/// `/debug/explain`'s answer: the router's [`Explanation`] with every worker, and the
/// winner, by name (as in `x-kvroute-route` and the metrics); each worker's number stays as
/// `id`, the one `/debug/workers` lists.
pub fn debug_view(gw: &Gateway, ex: &Explanation) -> serde_json::Value {
    let mut v = serde_json::to_value(ex).unwrap_or_default();
    if let Some(winner) = ex.winner {
        v["winner"] = name_of(gw, winner).into();
    }
    if let Some(list) = v.get_mut("workers").and_then(|w| w.as_array_mut()) {
        for (w, terms) in ex.workers.iter().zip(list.iter_mut()) {
            terms["id"] = w.worker.0.into();
            terms["worker"] = name_of(gw, w.worker).into();
        }
    }
    v
}
