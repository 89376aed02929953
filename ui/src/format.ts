// Formatting and SLO colouring shared by every page.

/** "—" when there is no figure. */
export const DASH = "—";

export function isNum(v: unknown): v is number {
  return typeof v === "number" && Number.isFinite(v);
}

/** Milliseconds: "12.3 ms" below 10 s, "12.3 s" above; "∞" for a failure counted as infinite. */
export function ms(v: number | string | null | undefined): string {
  if (v === "inf" || v === Infinity) return "∞";
  if (!isNum(v)) return DASH;
  if (v >= 10_000) return `${(v / 1000).toFixed(1)} s`;
  if (v >= 100) return `${Math.round(v)} ms`;
  return `${v.toFixed(1)} ms`;
}

/** A count or rate with thousands separators and at most `digits` decimals. */
export function num(v: number | null | undefined, digits = 0): string {
  if (!isNum(v)) return DASH;
  return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

/** A ratio as a percentage. */
export function pct(v: number | null | undefined, digits = 1): string {
  if (!isNum(v)) return DASH;
  return `${(v * 100).toFixed(digits)}%`;
}

export type SloClass = "bad" | "warn" | "ok" | "none";

/** Red above the limit, yellow within 90% of it, green below. */
export function sloClass(value: number | null | undefined, limit: number | null | undefined): SloClass {
  if (!isNum(value) || !isNum(limit)) return "none";
  if (value > limit) return "bad";
  if (value >= 0.9 * limit) return "warn";
  return "ok";
}

/** Improvement of `live` over `base` for a latency (lower is better), as "+12.3%". */
export function improvement(live: number | null | undefined, base: number | null | undefined): string {
  if (!isNum(live) || !isNum(base) || base === 0) return DASH;
  const d = ((base - live) / base) * 100;
  return `${d >= 0 ? "+" : ""}${d.toFixed(1)}%`;
}

/** The baseline point for a concurrency: the exact level, else the nearest. */
export function nearest<T extends { concurrency: number }>(points: T[] | undefined, c: number): T | undefined {
  if (!points || points.length === 0) return undefined;
  return points.reduce((best, p) =>
    Math.abs(p.concurrency - c) < Math.abs(best.concurrency - c) ? p : best,
  );
}

/** "3m 05s" from milliseconds. */
export function duration(msv: number | null | undefined): string {
  if (!isNum(msv)) return DASH;
  const s = Math.round(msv / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return `${m}m ${String(s % 60).padStart(2, "0")}s`;
}

/** Local time of day from Unix milliseconds. */
export function clock(unixMs: number | null | undefined): string {
  if (!isNum(unixMs)) return DASH;
  return new Date(unixMs).toLocaleTimeString("en-GB");
}
