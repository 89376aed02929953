//! The HTTP headers the gateway and the endpoint picker read and write (besides the
//! explanation's, `explanation.rs`).

/// The header carrying a request's id, both ways.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The header that steers a request to one data-parallel rank of an engine (vLLM reads it
/// in `_get_data_parallel_rank`, SGLang in its data-parallel controller).
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// The header naming the worker that served a request.
pub const WORKER_HEADER: &str = "x-kvroute-worker";
/// The response header naming the worker that computed a split request's prompt, when
/// another worker than `x-kvroute-worker` (which decoded) did (disaggregated prefill).
pub const PREFILL_WORKER_HEADER: &str = "x-kvroute-prefill-worker";

/// The header carrying the prompt tokens the router expected the chosen worker to have
/// cached (compare with the answer's `usage.prompt_tokens_details.cached_tokens`).
pub const PREDICTED_CACHED_HEADER: &str = "x-kvroute-predicted-cached-tokens";

/// The header by which a request opts out of mid-stream migration (`off`, `false` or `0`).
pub const MIGRATE_HEADER: &str = "x-kvroute-migrate";
