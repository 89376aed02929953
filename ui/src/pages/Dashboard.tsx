// The live A/B page: the candidate arm (the default policy) against the round-robin arm on an
// identical fleet under the same conversations, both live; the concurrency slider, KPIs, live
// charts of both arms (and of each class, when the gateway has several: docs/flow-control.md),
// refusals by tenant, the static comparison by level (filled from what both arms measured;
// recorded or simulated references only where no arm measured, labelled), and the workers.
import { useCallback, useEffect, useRef, useState } from "react";
import { baselinePolicy, sidePoint, sides, tableLevels, type SidePoint, type Sides } from "../ab";
import { control, usePoll } from "../api";
import { Kpi } from "../components/Kpi";
import { LiveChart, type Point } from "../components/LiveChart";
import { ConcurrencySlider } from "../components/Slider";
import { improvement, ms, nearest, num, pct, sloClass } from "../format";
import type {
  AccuracyCard,
  ArmStats,
  DashboardConfig,
  Fleet,
  FleetsAnswer,
  LevelPoint,
  LevelsAnswer,
  LiveStats,
  P50P95,
  RefusalCard,
} from "../types";

const HISTORY = 300;

function Cell(props: { v: number | string | null | undefined; limit?: number | null; testid?: string }) {
  const v = props.v;
  return (
    <td className={`slo-${typeof v === "string" ? "bad" : sloClass(v, props.limit ?? null)}`} data-testid={props.testid}>
      {ms(v)}
    </td>
  );
}

/** The baseline side's figures now: the live baseline arm, else a baseline file at the nearest level. */
function baseNow(
  s: Sides,
  stats: LiveStats | null,
  config: DashboardConfig | null,
): { label: string; point?: { ttft: P50P95; tpot: P50P95; itl: P50P95; e2e: P50P95 }; all?: P50P95 } {
  if (s.baseline) {
    const w = s.baseline.window.summary;
    return {
      label: s.baseline.name,
      point: { ttft: w.ttft_ms, tpot: w.tpot_ms, itl: w.itl_ms, e2e: w.e2e_ms },
      all: { p50: null, p95: null },
    };
  }
  const policy = baselinePolicy(s, config?.baselines ?? []);
  const files = (config?.baselines ?? []).filter((b) => b.policy === policy);
  const file = files.find((b) => !b.simulated) ?? files[0];
  const p = nearest(file?.points, stats?.concurrency ?? 0);
  if (!file || !p) return { label: "baseline" };
  return {
    label: `${file.policy} (${file.simulated ? "simulated" : "recorded"}, c${p.concurrency})`,
    point: { ttft: p.ttft_ms, tpot: p.tpot_ms, itl: p.itl_ms, e2e: p.e2e_ms },
  };
}

export function LiveTable(props: { stats: LiveStats | null; config: DashboardConfig | null }) {
  const { stats, config } = props;
  const s = sides(stats);
  // Cleared after Stop: the figures describe a load that no longer runs.
  const on = stats?.running ?? false;
  const w = on ? s.candidate?.window.summary : undefined;
  const b = on ? baseNow(s, stats, config) : { label: s.baseline?.name ?? "baseline" };
  const bw = on ? s.baseline?.window.summary : undefined;
  const cand = s.candidate?.name ?? "live";
  const rows: { name: string; live?: P50P95; base?: P50P95; limit: number | null }[] = [
    { name: "TTFT", live: w?.ttft_ms, base: b.point?.ttft, limit: config?.slo_ttft_p95_ms ?? null },
    { name: "TPOT", live: w?.tpot_ms, base: b.point?.tpot, limit: config?.slo_tpot_p95_ms ?? null },
    { name: "ITL", live: w?.itl_ms, base: b.point?.itl, limit: null },
    { name: "Latency", live: w?.e2e_ms, base: b.point?.e2e, limit: null },
  ];
  const allSent = (x: typeof w) => (x ? { p50: x.ttft_all_ms.p50, p95: x.ttft_all_ms.p95 } : undefined);
  const failures = (a: ArmStats | undefined) => {
    const x = a?.window.summary;
    if (!on || !x) return "—";
    return `${a?.name}: ${x.failed} failed, ${x.rejected} shed of ${x.sent} sent`;
  };
  const anyFailed = [s.candidate, s.baseline].some((a) => on && (a?.window.summary.failed ?? 0) + (a?.window.summary.rejected ?? 0) > 0);
  const ca = allSent(w);
  const ba = allSent(bw);
  return (
    <table className="live-table">
      <thead>
        <tr>
          <th>metric</th>
          <th>{cand} p50</th>
          <th className="muted">{b.label} p50</th>
          <th>{cand} p95</th>
          <th className="muted">{b.label} p95</th>
          <th>p95 improvement</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => (
          <tr key={r.name}>
            <th>{r.name}</th>
            <Cell v={r.live?.p50} limit={r.limit} testid={`live-${r.name}-p50`} />
            <Cell v={r.base?.p50} limit={r.limit} testid={`base-${r.name}-p50`} />
            <Cell v={r.live?.p95} limit={r.limit} testid={`live-${r.name}-p95`} />
            <Cell v={r.base?.p95} limit={r.limit} testid={`base-${r.name}-p95`} />
            <td data-testid={`improvement-${r.name}`}>{improvement(r.live?.p95, r.base?.p95)}</td>
          </tr>
        ))}
        <tr title="every request sent, a failed or shed one counting as an infinite TTFT">
          <th>TTFT, all sent</th>
          <Cell v={ca?.p50} limit={config?.slo_ttft_p95_ms} testid="live-TTFT-all-p50" />
          <Cell v={ba?.p50} limit={config?.slo_ttft_p95_ms} />
          <Cell v={ca?.p95} limit={config?.slo_ttft_p95_ms} testid="live-TTFT-all-p95" />
          <Cell v={ba?.p95} limit={config?.slo_ttft_p95_ms} />
          <td>
            {typeof ca?.p95 === "number" && typeof ba?.p95 === "number" ? improvement(ca.p95, ba.p95) : "—"}
          </td>
        </tr>
        <tr>
          <th>Failed / shed</th>
          <td colSpan={5} className={anyFailed ? "slo-bad" : ""} data-testid="failures">
            {failures(s.candidate)}
            {s.baseline ? ` · ${failures(s.baseline)}` : ""}
          </td>
        </tr>
      </tbody>
    </table>
  );
}

function Tag(props: { p: SidePoint | undefined }) {
  if (!props.p) return null;
  return <span className={`source-tag source-${props.p.source}`}>{props.p.source}</span>;
}

/** The static comparison: p95 TTFT and TPOT of both sides at every level, with the improvement. */
export function ComparisonTable(props: {
  stats: LiveStats | null;
  config: DashboardConfig | null;
  levels: LevelPoint[];
}) {
  const { stats, config, levels } = props;
  const s = sides(stats);
  const baselines = config?.baselines ?? [];
  const candName = s.candidate?.name;
  const baseName = baselinePolicy(s, baselines);
  if (!config) return <p className="muted">—</p>;
  const rows = tableLevels(config.slider_min, config.slider_max, config.slider_step, levels);
  const measuredBy = (arm: string | undefined) =>
    arm !== undefined && levels.some((l) => l.arms.some((a) => a.name === arm));
  return (
    <>
      <p className="muted">
        p95 at each level: <b>live</b> where both fleets ran it for {num(stats?.measure_after_secs ?? 90)} s (the 60 s window
        then holds only that level), else a <b>recorded</b> baseline file, else the fleet simulator's run of the same
        fleet, labelled <b>simulated</b>. Improvement: how much lower the {candName ?? "candidate"} figure is.
      </p>
      <table className="baseline-table" data-testid="comparison-table">
        <thead>
          <tr>
            <th rowSpan={2}>concurrency</th>
            <th colSpan={3}>TTFT p95</th>
            <th colSpan={3}>TPOT p95</th>
            <th colSpan={2}>KV hit</th>
          </tr>
          <tr>
            <th>{baseName ?? "baseline"}</th>
            <th>{candName ?? "live"}</th>
            <th>improvement</th>
            <th>{baseName ?? "baseline"}</th>
            <th>{candName ?? "live"}</th>
            <th>improvement</th>
            <th>{baseName ?? "baseline"}</th>
            <th>{candName ?? "live"}</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((level) => {
            const b = sidePoint(level, s.baseline?.name, baseName, levels, baselines);
            const c = sidePoint(level, candName, candName, levels, baselines);
            const here = stats?.running && level === stats.concurrency;
            return (
              <tr key={level} className={here ? "current" : ""} data-testid="comparison-row">
                <th>{level}</th>
                <Cell v={b?.ttft.p95} limit={config.slo_ttft_p95_ms} />
                <Cell v={c?.ttft.p95} limit={config.slo_ttft_p95_ms} />
                <td>{improvement(c?.ttft.p95, b?.ttft.p95)}</td>
                <Cell v={b?.tpot.p95} limit={config.slo_tpot_p95_ms} />
                <Cell v={c?.tpot.p95} limit={config.slo_tpot_p95_ms} />
                <td>{improvement(c?.tpot.p95, b?.tpot.p95)}</td>
                <td>{pct(b?.hit_rate)}</td>
                <td>
                  {pct(c?.hit_rate)} <Tag p={c ?? b} />
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <p className="muted">
        Save what a live arm measured as a baseline file (for `--baseline` on a later run):{" "}
        {(stats?.arms ?? []).map((a) =>
          measuredBy(a.name) ? (
            <a key={a.name} href={`/api/baseline?arm=${encodeURIComponent(a.name)}`} download data-testid="save-baseline">
              {a.name}{" "}
            </a>
          ) : (
            <span key={a.name}>{a.name} (no level measured yet) </span>
          ),
        )}
      </p>
    </>
  );
}

/** "98.4% of 32 (±3 tok)", or why the gateway no longer trusts the worker's index. */
export function accuracyText(a: AccuracyCard | null): string {
  if (!a || a.samples === 0 || a.exact_ratio === null) return "—";
  const err = a.mean_abs_error_tokens ? ` (±${num(a.mean_abs_error_tokens)} tok)` : "";
  const degraded = a.degraded ? ` — ${a.degraded.replace(/_/g, " ")}` : "";
  return `${pct(a.exact_ratio)} of ${num(a.samples)}${err}${degraded}`;
}

function accuracyClass(a: AccuracyCard | null): string {
  if (!a || a.exact_ratio === null) return "";
  if (a.degraded) return "slo-bad";
  return a.exact_ratio >= 0.9 ? "slo-ok" : "slo-warn";
}

export function WorkerCards(props: { fleet: Fleet | null }) {
  const f = props.fleet;
  if (!f) return <p className="muted">—</p>;
  if (!f.available) return <p className="muted">The target does not list its workers ({f.error}).</p>;
  // Pools are worth a line once a fleet has more than one role (a disaggregated fleet).
  const disaggregated = f.pools.length > 1 || f.pools.some((p) => p.role !== "both");
  return (
    <>
      {disaggregated && (
        <p className="pools" data-testid="pools">
          {f.pools.map((p) => (
            <span key={p.role} className="pool" data-testid="pool">
              {p.role}: {p.workers} worker{p.workers === 1 ? "" : "s"}, {p.inflight} in flight, {p.prefill_tokens} prefill tokens
            </span>
          ))}
        </p>
      )}
    <div className="workers">
      {f.workers.map((w) => (
        <div key={w.name} className={`worker${w.up ? "" : " down"}`} data-testid="worker-card">
          <h4>
            {w.name} <span className="muted">{w.up ? "up" : "down"}</span>
            {w.role && w.role !== "both" && (
              <span className={`role role-${w.role}`} data-testid="worker-role">
                {w.role}
              </span>
            )}
          </h4>
          <p className="muted engine" data-testid="worker-engine">
            {w.engine ?? "engine unknown"}
            {w.model ? ` · ${w.model}` : ""}
          </p>
          <dl>
            <dt>in flight</dt>
            <dd>{num(w.inflight)}</dd>
            <dt>KV usage</dt>
            <dd>{pct(w.kv_usage)}</dd>
            <dt>busy</dt>
            <dd>{pct(w.busy)}</dd>
            <dt>queue time</dt>
            <dd>{w.queue_time_secs === null ? "—" : ms(w.queue_time_secs * 1000)}</dd>
            <dt>running / waiting</dt>
            <dd>
              {num(w.running)} / {num(w.waiting)}
            </dd>
            <dt>index</dt>
            <dd data-testid="cache-state">{w.cache_state ?? "—"}</dd>
            <dt>predictions exact</dt>
            <dd data-testid="prediction-accuracy" className={accuracyClass(w.accuracy)}>
              {accuracyText(w.accuracy)}
            </dd>
          </dl>
        </div>
      ))}
    </div>
    </>
  );
}

/** The chart lines of each class of the fleets that have several classes, their TTFT p95
 * over the gateway's last minute appended at `t` (the keys are `arm · class`). */
export function addClassPoints(
  h: Record<string, Point[]>,
  fleets: FleetsAnswer,
  t: number,
): Record<string, Point[]> {
  // Lines already drawn keep their history (a read that gave no classes adds a gap).
  const next: Record<string, Point[]> = {};
  for (const [key, points] of Object.entries(h)) next[key] = [...points.slice(-(HISTORY - 1)), { t, v: null }];
  for (const a of fleets.arms) {
    const classes = a.fleet.classes ?? [];
    if (classes.length < 2) continue;
    for (const c of classes) {
      const key = `${a.arm} · ${c.class}`;
      next[key] = [...(h[key] ?? []).slice(-(HISTORY - 1)), { t, v: c.ttft_p95_ms }];
    }
  }
  return next;
}

/** Refusals by tenant, class and reason (those counted at all), every arm's, the most first. */
export function Refusals(props: { fleets: FleetsAnswer | null }) {
  const rows: (RefusalCard & { arm: string })[] = (props.fleets?.arms ?? [])
    .flatMap((a) => (a.fleet.refusals ?? []).filter((r) => r.total > 0).map((r) => ({ ...r, arm: a.arm })))
    .sort((x, y) => y.total - x.total)
    .slice(0, 20);
  if (rows.length === 0) return null;
  return (
    <section>
      <h2>Refusals by tenant</h2>
      <table className="refusals" data-testid="refusals">
        <thead>
          <tr>
            <th>fleet</th>
            <th>tenant</th>
            <th>class</th>
            <th>reason</th>
            <th>last 60 s</th>
            <th>since start</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => (
            <tr key={`${r.arm}/${r.tenant}/${r.class}/${r.reason}`} data-testid="refusal-row">
              <td>{r.arm}</td>
              <td>{r.tenant}</td>
              <td>{r.class}</td>
              <td>{r.reason}</td>
              <td>{num(r.window)}</td>
              <td>{num(r.total)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

/**
 * The model the load asks for, when the gateway serves several (`[[pools]]`): changed while
 * the load is stopped; the workers, queue and flow figures shown are that model's pool's.
 */
export function ModelPicker(props: { stats: LiveStats | null; models: string[] }) {
  const { stats, models } = props;
  const [error, setError] = useState<string | null>(null);
  if (models.length < 2 || !stats) return null;
  const locked = stats.running || stats.stopping;
  return (
    <p className="model-picker">
      <label>
        Model{" "}
        <select
          aria-label="Model"
          data-testid="model-select"
          value={stats.model}
          disabled={locked}
          title={locked ? "stop the load to change its model" : "the model the load asks for; the views below follow it"}
          onChange={(e) => {
            void control("/api/model", { model: e.target.value }).then(setError);
          }}
        >
          {(models.includes(stats.model) ? models : [stats.model, ...models]).map((m) => (
            <option key={m} value={m}>
              {m}
            </option>
          ))}
        </select>
      </label>{" "}
      <span className="muted">
        {locked ? "stop the load to change it" : `this gateway serves ${models.length} models; workers and figures below are this one's`}
      </span>
      {error && (
        <span className="error" role="alert">
          {error}
        </span>
      )}
    </p>
  );
}

export function Dashboard(props: { stats: LiveStats | null; config: DashboardConfig | null }) {
  const { stats, config } = props;
  const { data: fleets } = usePoll<FleetsAnswer>("/api/fleet", 2000);
  const { data: levelsAnswer } = usePoll<LevelsAnswer>("/api/levels", 5000);
  const levels = levelsAnswer?.levels ?? [];
  const [ttft, setTtft] = useState<Record<string, Point[]>>({});
  const [tpot, setTpot] = useState<Record<string, Point[]>>({});
  const lastTime = useRef<number | null>(null);
  useEffect(() => {
    if (!stats) return;
    const t = stats.time_unix_ms;
    const add = (pick: (a: ArmStats) => number | null) => (h: Record<string, Point[]>) => {
      const next: Record<string, Point[]> = {};
      for (const a of stats.arms) {
        next[a.name] = [...(h[a.name] ?? []).slice(-(HISTORY - 1)), { t, v: stats.running ? pick(a) : null }];
      }
      return next;
    };
    setTtft(add((a) => a.window.summary.ttft_ms.p95));
    setTpot(add((a) => a.window.summary.tpot_ms.p95));
    lastTime.current = t;
  }, [stats]);
  // Each class's TTFT p95 from the gateways, on the load's clock.
  const [classTtft, setClassTtft] = useState<Record<string, Point[]>>({});
  // Another model's pool: its classes' lines start afresh.
  const model = stats?.model;
  useEffect(() => setClassTtft({}), [model]);
  useEffect(() => {
    if (!fleets) return;
    // On the load's clock while it reports (its charts' x axis), else the browser's.
    const t = stats?.running && lastTime.current !== null ? lastTime.current : Date.now();
    setClassTtft((h) => addClassPoints(h, fleets, t));
  }, [fleets]);
  const setConcurrency = useCallback((n: number) => {
    void control("/api/concurrency", { concurrency: n });
  }, []);
  const s = sides(stats);
  const on = stats?.running ?? false;
  const w = on ? s.candidate?.window.summary : undefined;
  const bw = on ? s.baseline?.window.summary : undefined;
  const has = (w?.sent ?? 0) > 0;
  const vs = (f: (x: NonNullable<typeof bw>) => string) => (bw && (bw.sent ?? 0) > 0 ? `${s.baseline?.name}: ${f(bw)}` : null);
  const totals = on ? s.candidate?.totals : undefined;
  const btotals = on ? s.baseline?.totals : undefined;
  const errors = (totals?.failed ?? 0) + (totals?.rejected ?? 0);
  const fleetOf = (name: string | undefined) => fleets?.arms.find((a) => a.arm === name)?.fleet ?? null;
  const candFleet = fleetOf(s.candidate?.name);
  // The gateway's admission queue, as in the reference; else what waits in the workers.
  const queuedOf = (f: Fleet | null) =>
    !f?.available ? null : (f.queued ?? f.workers.reduce((sum, x) => sum + (x.waiting ?? 0), 0));
  const queued = on ? queuedOf(candFleet) : null;
  const bqueued = on ? queuedOf(fleetOf(s.baseline?.name)) : null;
  const series = (h: Record<string, Point[]>) =>
    (stats?.arms ?? []).map((a) => ({
      name: a.name,
      points: h[a.name] ?? [],
      className: a.baseline ? "series-baseline" : "series",
    }));
  const classSeries = Object.entries(classTtft).map(([name, points], i) => ({
    name,
    points,
    className: `series-class series-class-${i % 4}`,
  }));
  const title = s.baseline
    ? `Live: ${s.candidate?.name} vs ${s.baseline.name} on an identical fleet`
    : `Live vs ${baselinePolicy(s, config?.baselines ?? []) ?? "baseline"}`;
  return (
    <div className="dashboard">
      <section>
        <h2>{title}</h2>
        {config && (
          <p className="muted">
            SLO: TTFT p95 &lt; {config.slo_ttft_p95_ms} ms, TPOT p95 &lt; {config.slo_tpot_p95_ms} ms
            {s.baseline ? " — both fleets get the same conversations at the same concurrency" : ""}
          </p>
        )}
        <ModelPicker stats={stats} models={candFleet?.models ?? []} />
        <LiveTable stats={stats} config={config} />
        {config && (
          <ConcurrencySlider
            min={config.slider_min}
            max={config.slider_max}
            step={config.slider_step}
            applied={stats?.concurrency ?? null}
            pending={stats?.pending_concurrency ?? null}
            onChange={setConcurrency}
          />
        )}
      </section>
      <section className="kpis">
        <Kpi
          label="RPS"
          value={has ? num(w?.requests_per_s, 2) : "—"}
          vs={vs((x) => num(x.requests_per_s, 2))}
          hint="completed requests per second, last 60 s"
        />
        <Kpi
          label="Requests"
          value={totals && totals.sent > 0 ? num(totals.completed) : "—"}
          vs={btotals && btotals.sent > 0 ? `${s.baseline?.name}: ${num(btotals.completed)}` : null}
          hint={`completed since Start${totals ? ` (${num(totals.sent)} ended in all)` : ""}`}
        />
        <Kpi label="Output tokens/s" value={has ? num(w?.output_tokens_per_s) : "—"} vs={vs((x) => num(x.output_tokens_per_s))} />
        <Kpi
          label="KV cache hit"
          value={has ? pct(w?.hit_rate) : "—"}
          vs={vs((x) => pct(x.hit_rate))}
          hint="cached / prompt tokens, last 60 s"
        />
        <Kpi
          label="Queued"
          value={queued === null ? "—" : num(queued)}
          vs={bqueued === null || !s.baseline ? null : `${s.baseline.name}: ${num(bqueued)}`}
          hint="requests waiting in the gateway's admission queue"
        />
        <Kpi
          label="Errors"
          value={totals && totals.sent > 0 ? num(errors) : "—"}
          vs={btotals && btotals.sent > 0 ? `${s.baseline?.name}: ${num(btotals.failed + btotals.rejected)}` : null}
          alert={errors > 0}
          hint="failed + shed since Start"
        />
      </section>
      <section className="charts">
        <LiveChart
          title={
            classSeries.length > 0
              ? "TTFT p95 (60 s window; by class: the gateway's, by first token)"
              : "TTFT p95 (60 s window)"
          }
          series={[...series(ttft), ...classSeries]}
          limit={config?.slo_ttft_p95_ms ?? null}
          unit="ms"
        />
        <LiveChart title="TPOT p95 (60 s window)" series={series(tpot)} limit={config?.slo_tpot_p95_ms ?? null} unit="ms" />
      </section>
      <Refusals fleets={fleets} />
      <section>
        <h2>Benchmark: {baselinePolicy(s, config?.baselines ?? []) ?? "baseline"} vs {s.candidate?.name ?? "live"} by concurrency</h2>
        <ComparisonTable stats={stats} config={config} levels={levels} />
      </section>
      <section>
        <h2>Workers</h2>
        {(fleets?.arms ?? []).map((a) => (
          <div key={a.arm} className="arm-group" data-testid="arm-workers">
            <h3>
              {a.arm}{" "}
              <span className="muted">
                — {a.fleet.policy ? `policy ${a.fleet.policy}` : a.target}
                {a.fleet.pool ? ` · model ${a.fleet.pool}` : ""}
              </span>
            </h3>
            <WorkerCards fleet={a.fleet} />
          </div>
        ))}
        {!fleets && <p className="muted">—</p>}
      </section>
    </div>
  );
}
