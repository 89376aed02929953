// The shapes the kvroute load generator's API answers (see docs/loadgen.md).

export interface Distribution {
  count: number;
  mean: number | null;
  p50: number | null;
  p90: number | null;
  p95: number | null;
  p99: number | null;
}

export interface Summary {
  sent: number;
  completed: number;
  failed: number;
  rejected: number;
  failed_by_reason: Record<string, number>;
  rejected_by_reason: Record<string, number>;
  duration_secs: number;
  ttft_ms: Distribution;
  ttft_all_ms: { p50: number | string | null; p95: number | string | null; p99: number | string | null };
  tpot_ms: Distribution;
  itl_ms: Distribution;
  e2e_ms: Distribution;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  hit_rate: number | null;
  output_tokens_per_s: number | null;
  requests_per_s: number | null;
}

export interface Totals {
  sent: number;
  completed: number;
  failed: number;
  rejected: number;
  cancelled: number;
  in_flight: number;
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
}

export interface WindowStats {
  span_secs: number;
  covered_secs: number;
  overflowed: number;
  summary: Summary;
}

/** One arm of the live A/B: the same load against its own fleet. */
export interface ArmStats {
  name: string;
  target: string;
  baseline: boolean;
  active_conversations: number;
  totals: Totals;
  window: WindowStats;
}

export interface LiveStats {
  time_unix_ms: number;
  running: boolean;
  stopping: boolean;
  concurrency: number;
  pending_concurrency: number | null;
  max_concurrency: number;
  /** Seconds the applied concurrency has held while running. */
  level_secs: number | null;
  measure_after_secs: number;
  rate: number | null;
  workload: string;
  runs: number;
  arms: ArmStats[];
}

export interface ArmConfig {
  name: string;
  target: string;
  baseline: boolean;
}

/** What one arm measured at one level (its window once the level had held long enough). */
export interface ArmPoint {
  name: string;
  baseline: boolean;
  held_secs: number;
  taken_unix_ms: number;
  summary: Summary;
}

export interface LevelPoint {
  concurrency: number;
  arms: ArmPoint[];
}

export interface P50P95 {
  p50: number | null;
  p95: number | null;
}

export interface BaselinePoint {
  concurrency: number;
  ttft_ms: P50P95;
  tpot_ms: P50P95;
  itl_ms: P50P95;
  e2e_ms: P50P95;
  requests_per_s: number | null;
  output_tokens_per_s: number | null;
  hit_rate: number | null;
}

export interface Baseline {
  policy: string;
  workers: number;
  workload: string;
  source: string;
  /** Made by the fleet simulator: shown labelled so, never as a measurement. */
  simulated: boolean;
  points: BaselinePoint[];
}

export interface DashboardConfig {
  slo_ttft_p95_ms: number;
  slo_tpot_p95_ms: number;
  slider_min: number;
  slider_max: number;
  slider_step: number;
  baselines: Baseline[];
}

export interface ConfigAnswer {
  dashboard: DashboardConfig;
  arms: ArmConfig[];
  workload: string;
  rate: number | null;
}

export interface WorkerCard {
  name: string;
  url: string;
  up: boolean;
  engine: string | null;
  model: string | null;
  inflight: number | null;
  index_blocks: number | null;
  kv_usage: number | null;
  busy: number | null;
  queue_time_secs: number | null;
  running: number | null;
  waiting: number | null;
  cache_state: string | null;
  accuracy: AccuracyCard | null;
}

/** How well the gateway predicted a worker's cached tokens over its recent requests. */
export interface AccuracyCard {
  samples: number;
  exact_ratio: number | null;
  mean_abs_error_tokens: number | null;
  over: number;
  under: number;
  degraded: string | null;
  repairs: number;
}

/** One worker's terms in a routing decision (the gateway's x-kvroute-route). */
export interface RouteTerms {
  name: string;
  matched_blocks: number;
  /** Blocks loadable from host memory / disk after the matched ones (absent: none). */
  host_blocks?: number;
  disk_blocks?: number;
  uncached_tokens: number;
  inflight: number;
  prefill_tokens: number;
  busy: boolean;
  eligible: boolean;
  cost: number | null;
  chosen: boolean;
}

/** Why the gateway sent a turn where it did. */
export interface RouteExplanation {
  policy: string;
  prompt_tokens: number;
  block_size: number;
  omitted: number;
  workers: RouteTerms[];
}

export interface Fleet {
  available: boolean;
  error: string | null;
  policy: string | null;
  queued: number | null;
  workers: WorkerCard[];
}

/** `/api/fleet`: the fleet behind each arm. */
export interface FleetsAnswer {
  arms: { arm: string; baseline: boolean; target: string; fleet: Fleet }[];
}

export type ConversationStatus = "active" | "completed" | "error" | "stopped";

export interface ConversationSummary {
  id: number;
  status: ConversationStatus;
  topic: string;
  turns: number;
  planned_turns: number;
  started_unix_ms: number;
  duration_ms: number;
  error: string | null;
}

export interface TurnView {
  turn: number;
  status: string;
  error: string | null;
  ttft_ms: number | null;
  itl_ms: number | null;
  tpot_ms: number | null;
  latency_ms: number | null;
  input_tokens: number;
  cached_tokens: number;
  predicted_cached_tokens: number | null;
  output_tokens: number;
  worker: string | null;
  route: RouteExplanation | null;
  user: string;
  assistant: string;
}

export interface ConversationDetail extends Omit<ConversationSummary, "turns"> {
  turns: TurnView[];
}
