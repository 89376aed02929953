// Generated from the Rust types of the load generator's control API by ts-rs: do not
// edit. Regenerate with `KVROUTE_WRITE_TS=1 cargo test -p kvroute-loadgen --test ts_types`
// (crates/loadgen/tests/ts_types.rs); the UI imports these through `types.ts`.

/**
 * How well the gateway predicted a worker's cached tokens (its `/debug/workers` accuracy).
 */
export type AccuracyCard = {
  /**
   * Requests in the recent window.
   */
  samples: number,
  /**
   * Share of them predicted exactly.
   */
  exact_ratio: number | null,
  /**
   * Their mean absolute error, in tokens.
   */
  mean_abs_error_tokens: number | null,
  /**
   * Over- and under-predictions among them.
   */
  over: number,
  /**
   * Under-predictions among them.
   */
  under: number,
  /**
   * Why the gateway marked the worker degraded, when it did.
   */
  degraded: string | null,
  /**
   * Times its index was rebuilt for it.
   */
  repairs: number,
};

/**
 * TTFT percentiles over every sent request, failures and rejections counting as infinite.
 * Serialized with `"inf"` for infinite values and `null` without requests.
 */
export type AllSentTtft = {
  /**
   * Median, in milliseconds.
   */
  p50: number | "inf" | null,
  /**
   * 95th percentile, in milliseconds.
   */
  p95: number | "inf" | null,
  /**
   * 99th percentile, in milliseconds.
   */
  p99: number | "inf" | null,
};

/**
 * An arm's settings.
 */
export type ArmConfig = {
  /**
   * Its name in the statistics, the metrics' `arm` label and the dashboard (the demo
   * names its arms by policy): 1-32 characters of `[A-Za-z0-9_.-]`.
   */
  name: string,
  /**
   * Base URL of the endpoint it drives.
   */
  target: string,
  /**
   * Whether it is the baseline the other arms are compared with.
   */
  baseline: boolean,
};

/**
 * One arm's fleet in `GET /api/fleet`.
 */
export type ArmFleet = {
  /**
   * The arm's name.
   */
  arm: string,
  /**
   * Whether it is the baseline.
   */
  baseline: boolean,
  /**
   * The endpoint it drives.
   */
  target: string,
  /**
   * The fleet behind it.
   */
  fleet: Fleet,
};

/**
 * One arm's figures at one level.
 */
export type ArmPoint = {
  /**
   * The arm.
   */
  name: string,
  /**
   * Whether it is the baseline.
   */
  baseline: boolean,
  /**
   * Seconds the level had held when the figures were taken.
   */
  held_secs: number,
  /**
   * When, in milliseconds since the Unix epoch.
   */
  taken_unix_ms: number,
  /**
   * Its window at that instant.
   */
  summary: Summary,
};

/**
 * An arm's figures, as the dashboard sees them.
 */
export type ArmStats = {
  /**
   * Its name.
   */
  name: string,
  /**
   * The endpoint it drives.
   */
  target: string,
  /**
   * Whether it is the baseline.
   */
  baseline: boolean,
  /**
   * Conversations under way.
   */
  active_conversations: number,
  /**
   * Counts since the current run started.
   */
  totals: Totals,
  /**
   * The rolling window.
   */
  window: WindowStats,
};

/**
 * A baseline file.
 */
export type Baseline = {
  /**
   * Always [`FORMAT`].
   */
  format: string,
  /**
   * Always [`VERSION`].
   */
  version: number,
  /**
   * The policy measured.
   */
  policy: string,
  /**
   * Workers in the fleet.
   */
  workers: number,
  /**
   * The workload, as given to `kvroute bench`.
   */
  workload: string,
  /**
   * How it was produced (back end, profile), free text.
   */
  source: string,
  /**
   * Whether the fleet simulator produced it (the dashboard labels it so: a simulated
   * baseline is not a measurement of any fleet).
   */
  simulated: boolean,
  /**
   * Ascending concurrency, no repeats.
   */
  points: Array<BaselinePoint>,
};

/**
 * One concurrency level.
 */
export type BaselinePoint = {
  /**
   * Conversations in flight.
   */
  concurrency: number,
  /**
   * Time to first token.
   */
  ttft_ms: P50P95,
  /**
   * Time per output token.
   */
  tpot_ms: P50P95,
  /**
   * Inter-token latency.
   */
  itl_ms: P50P95,
  /**
   * End-to-end latency.
   */
  e2e_ms: P50P95,
  /**
   * Completed requests per second.
   */
  requests_per_s: number | null,
  /**
   * Output tokens per second.
   */
  output_tokens_per_s: number | null,
  /**
   * Cached / input tokens.
   */
  hit_rate: number | null,
};

/**
 * One class's time to first token over the window.
 */
export type ClassCard = {
  /**
   * The class.
   */
  class: string,
  /**
   * Requests of it that got a first token in the window.
   */
  requests: number,
  /**
   * Their median time to first token, in milliseconds (none without requests).
   */
  ttft_p50_ms: number | null,
  /**
   * Their 95th percentile.
   */
  ttft_p95_ms: number | null,
};

/**
 * `GET /api/config`: the dashboard's settings, the arms and what the load is.
 */
export type ConfigAnswer = {
  /**
   * Objectives, slider, baseline files.
   */
  dashboard: DashboardConfig,
  /**
   * The arms, in order.
   */
  arms: Array<ArmConfig>,
  /**
   * What the requests are.
   */
  workload: LoadKind,
  /**
   * The open loop's rate, if the load is open.
   */
  rate: number | null,
};

/**
 * A conversation with its transcript: its list entry's fields, with `turns` the turns
 * themselves (not flattened from [`ConversationSummary`]: its count of turns would be a second
 * `turns` key in the same JSON object).
 */
export type ConversationDetail = {
  /**
   * Its number, in start order.
   */
  id: number,
  /**
   * Where it stands.
   */
  status: ConversationStatus,
  /**
   * A short topic line.
   */
  topic: string,
  /**
   * Turns planned.
   */
  planned_turns: number,
  /**
   * When it started, in milliseconds since the Unix epoch.
   */
  started_unix_ms: number,
  /**
   * How long it ran (so far), in milliseconds.
   */
  duration_ms: number,
  /**
   * The last error, if any.
   */
  error: string | null,
  /**
   * Its turns so far, in order.
   */
  turns: Array<TurnView>,
};

/**
 * Where a conversation stands.
 */
export type ConversationStatus = "active" | "completed" | "error" | "stopped";

/**
 * A conversation in the list.
 */
export type ConversationSummary = {
  /**
   * Its number, in start order.
   */
  id: number,
  /**
   * Where it stands.
   */
  status: ConversationStatus,
  /**
   * A short topic line.
   */
  topic: string,
  /**
   * Turns sent so far.
   */
  turns: number,
  /**
   * Turns planned.
   */
  planned_turns: number,
  /**
   * When it started, in milliseconds since the Unix epoch.
   */
  started_unix_ms: number,
  /**
   * How long it ran (so far), in milliseconds.
   */
  duration_ms: number,
  /**
   * The last error, if any.
   */
  error: string | null,
};

/**
 * `GET /api/conversations`: the newest conversations first.
 */
export type ConversationsAnswer = {
  /**
   * At most the limit asked for.
   */
  conversations: Array<ConversationSummary>,
};

/**
 * The dashboard's settings.
 */
export type DashboardConfig = {
  /**
   * TTFT p95 objective, in milliseconds.
   */
  slo_ttft_p95_ms: number,
  /**
   * TPOT p95 objective, in milliseconds.
   */
  slo_tpot_p95_ms: number,
  /**
   * Lowest concurrency of the slider.
   */
  slider_min: number,
  /**
   * Highest concurrency of the slider.
   */
  slider_max: number,
  /**
   * Step of the slider.
   */
  slider_step: number,
  /**
   * Baseline files' contents (`kvroute bench` writes them; each names its policy and
   * says whether the fleet simulator made it): compared with where no live arm measured.
   */
  baselines: Array<Baseline>,
};

/**
 * Summary of a set of samples (milliseconds in reports); fields are `None` (JSON null)
 * without samples.
 */
export type Distribution = {
  /**
   * Number of samples.
   */
  count: number,
  /**
   * Arithmetic mean.
   */
  mean: number | null,
  /**
   * Median.
   */
  p50: number | null,
  /**
   * 90th percentile.
   */
  p90: number | null,
  /**
   * 95th percentile.
   */
  p95: number | null,
  /**
   * 99th percentile.
   */
  p99: number | null,
};

/**
 * The fleet behind the target.
 */
export type Fleet = {
  /**
   * Whether the target told its workers (a kvroute gateway does).
   */
  available: boolean,
  /**
   * Why not, when not.
   */
  error: string | null,
  /**
   * The gateway's routing policy.
   */
  policy: string | null,
  /**
   * Requests waiting in the gateway's admission queue (its `kvroute_queued_requests`).
   */
  queued: number | null,
  /**
   * Its workers.
   */
  workers: Array<WorkerCard>,
  /**
   * Each role's workers and load together, for the roles that have workers (the
   * gateway's `/debug/workers` `pools`).
   */
  pools: Array<PoolCard>,
  /**
   * Each class's time to first token over the last minute (the gateway's metrics).
   */
  classes: Array<ClassCard>,
  /**
   * Refusals by tenant, class and reason (the gateway's metrics).
   */
  refusals: Array<RefusalCard>,
  /**
   * The models the target serves (its `/v1/models`, at most [`MAX_MODELS`]; also when
   * it is not a kvroute gateway).
   */
  models: Array<string>,
  /**
   * The gateway's pool these views are of, when it serves several models (its
   * `/debug/workers` `model`).
   */
  pool: string | null,
};

/**
 * `GET /api/fleet`: the fleet behind each arm.
 */
export type FleetsAnswer = {
  /**
   * One per arm, in order.
   */
  arms: Array<ArmFleet>,
};

/**
 * Requests meeting the SLO.
 */
export type Goodput = {
  /**
   * The objective.
   */
  slo: Slo,
  /**
   * Requests that met it.
   */
  met: number,
  /**
   * Of the requests sent, the fraction that met it.
   */
  fraction_of_sent: number | null,
  /**
   * Requests meeting it per second of the run.
   */
  per_s: number | null,
};

/**
 * Every arm's figures at one concurrency level.
 */
export type LevelPoint = {
  /**
   * Conversations in flight.
   */
  concurrency: number,
  /**
   * One per arm that measured it, in the service's arm order.
   */
  arms: Array<ArmPoint>,
};

/**
 * `GET /api/levels`: what every arm measured at each level it held.
 */
export type LevelsAnswer = {
  /**
   * Ascending concurrency.
   */
  levels: Array<LevelPoint>,
};

/**
 * What the dashboard sees, published every tick and after every change.
 */
export type LiveStats = {
  /**
   * When these figures were taken, in milliseconds since the Unix epoch.
   */
  time_unix_ms: number,
  /**
   * Whether the load runs.
   */
  running: boolean,
  /**
   * Whether a stopped load still has turns finishing.
   */
  stopping: boolean,
  /**
   * The concurrency applied (closed loop).
   */
  concurrency: number,
  /**
   * A concurrency asked for and not yet applied (debounce).
   */
  pending_concurrency: number | null,
  /**
   * The most a concurrency may be set to.
   */
  max_concurrency: number,
  /**
   * Seconds the applied concurrency has held while running.
   */
  level_secs: number | null,
  /**
   * Seconds a level must hold before it counts as measured.
   */
  measure_after_secs: number,
  /**
   * The open loop's rate, if the load is open.
   */
  rate: number | null,
  /**
   * The `model` the load's requests name (the next start's while stopped).
   */
  model: string,
  /**
   * What the requests are.
   */
  workload: LoadKind,
  /**
   * Runs started since the service began.
   */
  runs: number,
  /**
   * Every arm's figures, in the configured order.
   */
  arms: Array<ArmStats>,
};

/**
 * What the requests are.
 */
export type LoadKind = "multiturn" | "synthetic";

/**
 * A median and a 95th percentile, milliseconds.
 */
export type P50P95 = {
  /**
   * Median.
   */
  p50: number | null,
  /**
   * 95th percentile.
   */
  p95: number | null,
};

/**
 * The workers of one role together.
 */
export type PoolCard = {
  /**
   * The role: `both`, `prefill` or `decode`.
   */
  role: string,
  /**
   * Its workers.
   */
  workers: number,
  /**
   * Requests the gateway has in flight on them.
   */
  inflight: number,
  /**
   * Prompt tokens without a first token yet on them.
   */
  prefill_tokens: number,
};

/**
 * Refusals of one tenant's requests of one class for one reason.
 */
export type RefusalCard = {
  /**
   * The tenant.
   */
  tenant: string,
  /**
   * The class.
   */
  class: string,
  /**
   * Why (`tenant_limit`, `queue_full`, `deadline`, ...).
   */
  reason: string,
  /**
   * Since the gateway started.
   */
  total: number,
  /**
   * In the window.
   */
  window: number,
};

/**
 * A kvroute gateway's explanation of one routing decision, as its `x-kvroute-route` header
 * gives it (asked for with `x-kvroute-explain: 1`).
 */
export type RouteExplanation = {
  /**
   * The routing policy.
   */
  policy: string,
  /**
   * Prompt tokens as the router counted them.
   */
  prompt_tokens: number,
  /**
   * Tokens per KV block.
   */
  block_size: number,
  /**
   * Workers left out of the list.
   */
  omitted: number,
  /**
   * The chosen worker first, then the others by cost.
   */
  workers: Array<RouteTerms>,
};

/**
 * One worker's terms in a routing decision.
 */
export type RouteTerms = {
  /**
   * The worker's name.
   */
  name: string,
  /**
   * Leading prompt blocks the router believed it holds.
   */
  matched_blocks: number,
  /**
   * Prompt blocks after those it could load back from host memory.
   */
  host_blocks: number,
  /**
   * Prompt blocks after those it could load back from disk.
   */
  disk_blocks: number,
  /**
   * Prompt tokens it would have to compute.
   */
  uncached_tokens: number,
  /**
   * Requests in flight on it.
   */
  inflight: number,
  /**
   * Prefill tokens outstanding on it.
   */
  prefill_tokens: number,
  /**
   * Busy by the admission thresholds.
   */
  busy: boolean,
  /**
   * Offered to the policy.
   */
  eligible: boolean,
  /**
   * The policy's cost (lower wins), when it computes one.
   */
  cost: number | null,
  /**
   * Whether it was chosen.
   */
  chosen: boolean,
};

/**
 * A service level objective for goodput; an unset limit always holds.
 */
export type Slo = {
  /**
   * Largest TTFT, in milliseconds.
   */
  ttft_ms: number | null,
  /**
   * Largest TPOT, in milliseconds (requests with one output token pass it).
   */
  tpot_ms: number | null,
};

/**
 * The summary of a run.
 */
export type Summary = {
  /**
   * Requests sent (records given).
   */
  sent: number,
  /**
   * Requests completed.
   */
  completed: number,
  /**
   * Requests that failed after dispatch.
   */
  failed: number,
  /**
   * Requests rejected before dispatch.
   */
  rejected: number,
  /**
   * Failures by reason.
   */
  failed_by_reason: { [key in string]: number },
  /**
   * Rejections by reason.
   */
  rejected_by_reason: { [key in string]: number },
  /**
   * Length of the run, in seconds.
   */
  duration_secs: number,
  /**
   * TTFT of completed requests, in milliseconds.
   */
  ttft_ms: Distribution,
  /**
   * TTFT over all sent requests, failures and rejections infinite, in milliseconds.
   */
  ttft_all_ms: AllSentTtft,
  /**
   * TPOT of completed requests with two or more output tokens, in milliseconds.
   */
  tpot_ms: Distribution,
  /**
   * Inter-token gaps of completed requests, each gap weighted once, in milliseconds.
   */
  itl_ms: Distribution,
  /**
   * End-to-end latency of completed requests, in milliseconds.
   */
  e2e_ms: Distribution,
  /**
   * Prompt tokens of completed requests.
   */
  input_tokens: number,
  /**
   * Cached prompt tokens of completed requests, as the engines reported.
   */
  cached_tokens: number,
  /**
   * Cached prompt tokens of completed requests, as the router predicted.
   */
  predicted_cached_tokens: number,
  /**
   * Output tokens of completed requests.
   */
  output_tokens: number,
  /**
   * KV hit rate: cached / input tokens of completed requests.
   */
  hit_rate: number | null,
  /**
   * Predicted / actual cached tokens (1 = the router's view matched the engines' on
   * aggregate).
   */
  prediction_ratio: number | null,
  /**
   * Sum over completed requests of |predicted - cached|, over the sum of input tokens (0 =
   * every prediction exact).
   */
  prediction_error: number | null,
  /**
   * Output tokens of completed requests per second.
   */
  output_tokens_per_s: number | null,
  /**
   * Completed requests per second.
   */
  requests_per_s: number | null,
  /**
   * Requests meeting the SLO, when one was given.
   */
  goodput: Goodput | null,
};

/**
 * Counts since the current run started.
 */
export type Totals = {
  /**
   * Requests that ended (completed, failed or rejected).
   */
  sent: number,
  /**
   * Completed.
   */
  completed: number,
  /**
   * Failed after dispatch (errors, dropped streams, timeouts).
   */
  failed: number,
  /**
   * Refused before dispatch (shed, queue full).
   */
  rejected: number,
  /**
   * Cut off by a stop, not counted as sent.
   */
  cancelled: number,
  /**
   * In flight now.
   */
  in_flight: number,
  /**
   * Prompt tokens of completed requests.
   */
  input_tokens: number,
  /**
   * Cached prompt tokens of completed requests.
   */
  cached_tokens: number,
  /**
   * Output tokens of completed requests.
   */
  output_tokens: number,
};

/**
 * One turn as the dashboard shows it.
 */
export type TurnView = {
  /**
   * The turn number, from 1.
   */
  turn: number,
  /**
   * `completed`, `failed` or `rejected`; `in_flight` while it runs.
   */
  status: string,
  /**
   * Why it failed or was refused.
   */
  error: string | null,
  /**
   * Time to first token, in milliseconds.
   */
  ttft_ms: number | null,
  /**
   * Mean gap between tokens, in milliseconds.
   */
  itl_ms: number | null,
  /**
   * Time per output token after the first, in milliseconds.
   */
  tpot_ms: number | null,
  /**
   * From sending to the last token, in milliseconds.
   */
  latency_ms: number | null,
  /**
   * Prompt tokens.
   */
  input_tokens: number,
  /**
   * Prompt tokens the engine had cached.
   */
  cached_tokens: number,
  /**
   * Prompt tokens the router predicted cached (when the server says).
   */
  predicted_cached_tokens: number | null,
  /**
   * Tokens generated.
   */
  output_tokens: number,
  /**
   * The worker that served it (when the server says).
   */
  worker: string | null,
  /**
   * The worker that computed its prompt, when another than `worker` did (disaggregated
   * prefill; when the server says).
   */
  prefill_worker: string | null,
  /**
   * Why the router chose it (when the server says).
   */
  route: RouteExplanation | null,
  /**
   * The user's message of this turn (cut to the store's limit).
   */
  user: string,
  /**
   * The answer (cut to the store's limit).
   */
  assistant: string,
};

/**
 * A window's figures at one instant.
 */
export type WindowStats = {
  /**
   * The window's length asked for, in seconds.
   */
  span_secs: number,
  /**
   * The time the figures cover, in seconds: the span, or less when the load has not run
   * that long or more turns finished than the window holds.
   */
  covered_secs: number,
  /**
   * Records pushed out early because the window was full (its figures then cover less
   * than the span).
   */
  overflowed: number,
  /**
   * The turns' statistics (rates over `covered_secs`).
   */
  summary: Summary,
};

/**
 * One worker as the dashboard shows it.
 */
export type WorkerCard = {
  /**
   * Its name.
   */
  name: string,
  /**
   * Its base URL.
   */
  url: string,
  /**
   * Whether the gateway sends it traffic.
   */
  up: boolean,
  /**
   * Its role in a disaggregated fleet (`both`, `prefill`, `decode`), when the gateway
   * says.
   */
  role: string | null,
  /**
   * The engine behind it, from its metrics (`vLLM`, `SGLang`, or kvroute's simulated
   * engine with its profile).
   */
  engine: string | null,
  /**
   * The model it serves, from its metrics.
   */
  model: string | null,
  /**
   * Requests the gateway has in flight on it.
   */
  inflight: number | null,
  /**
   * Prefix blocks the gateway's index holds for it.
   */
  index_blocks: number | null,
  /**
   * Fraction of its KV cache in use.
   */
  kv_usage: number | null,
  /**
   * Fraction of time it spent computing (simulated workers).
   */
  busy: number | null,
  /**
   * Mean seconds a request waited before its first step.
   */
  queue_time_secs: number | null,
  /**
   * Requests running.
   */
  running: number | null,
  /**
   * Requests waiting.
   */
  waiting: number | null,
  /**
   * How far the gateway trusts its index of it (`exact`, `catching_up`, `unknown`,
   * `approximate`).
   */
  cache_state: string | null,
  /**
   * The gateway's prediction accuracy for it over its recent requests.
   */
  accuracy: AccuracyCard | null,
};
