// The live A/B's sides: which arm is the candidate (the policy on show) and which the
// baseline, and where each side's figures at a concurrency level come from: what a live arm
// measured there, else a recorded baseline file, else a simulated reference (labelled so).
import type { ArmStats, Baseline, BaselinePoint, LevelPoint, LiveStats, P50P95, Summary } from "./types";

export interface Sides {
  candidate: ArmStats | undefined;
  baseline: ArmStats | undefined;
}

/** The candidate (first arm that is not the baseline) and the baseline arm, if live. */
export function sides(stats: LiveStats | null): Sides {
  const arms = stats?.arms ?? [];
  return { candidate: arms.find((a) => !a.baseline) ?? arms[0], baseline: arms.find((a) => a.baseline) };
}

export type Source = "live" | "recorded" | "simulated";

/** One side's p95 figures at one level, and where they come from. */
export interface SidePoint {
  ttft: P50P95;
  tpot: P50P95;
  hit_rate: number | null;
  tops: number | null;
  source: Source;
}

function fromSummary(s: Summary): SidePoint {
  return {
    ttft: { p50: s.ttft_ms.p50, p95: s.ttft_ms.p95 },
    tpot: { p50: s.tpot_ms.p50, p95: s.tpot_ms.p95 },
    hit_rate: s.hit_rate,
    tops: s.output_tokens_per_s,
    source: "live",
  };
}

function fromBaseline(p: BaselinePoint, simulated: boolean): SidePoint {
  return {
    ttft: p.ttft_ms,
    tpot: p.tpot_ms,
    hit_rate: p.hit_rate,
    tops: p.output_tokens_per_s,
    source: simulated ? "simulated" : "recorded",
  };
}

/** Policy `policy` at `level`: measured live by arm `arm`, else a recorded file, else a simulated one. */
export function sidePoint(
  level: number,
  arm: string | undefined,
  policy: string | undefined,
  levels: LevelPoint[],
  baselines: Baseline[],
): SidePoint | undefined {
  const measured = levels.find((l) => l.concurrency === level)?.arms.find((a) => a.name === arm);
  if (measured) return fromSummary(measured.summary);
  for (const simulated of [false, true]) {
    const file = baselines.find((b) => b.policy === policy && b.simulated === simulated);
    const p = file?.points.find((x) => x.concurrency === level);
    if (p) return fromBaseline(p, simulated);
  }
  return undefined;
}

/** The policy the baseline side stands for: the live baseline arm's, else the first file's that is not the candidate's. */
export function baselinePolicy(s: Sides, baselines: Baseline[]): string | undefined {
  if (s.baseline) return s.baseline.name;
  return baselines.find((b) => b.policy !== s.candidate?.name)?.policy;
}

/** The levels of the static table: the slider's steps and any level measured live. */
export function tableLevels(min: number, max: number, step: number, levels: LevelPoint[]): number[] {
  const set = new Set<number>();
  for (let c = min; c <= max && step > 0; c += step) set.add(c);
  for (const l of levels) set.add(l.concurrency);
  return [...set].sort((a, b) => a - b);
}
