// The live A/B page: live figures against the round-robin baseline at the same concurrency,
// the concurrency slider, KPIs, the baseline's whole curve, the workers, and live charts.
import { useCallback, useEffect, useState } from "react";
import { control, usePoll } from "../api";
import { Kpi } from "../components/Kpi";
import { LiveChart, type Point } from "../components/LiveChart";
import { ConcurrencySlider } from "../components/Slider";
import { improvement, ms, nearest, num, pct, sloClass } from "../format";
import type { AccuracyCard, DashboardConfig, Fleet, LiveStats, P50P95 } from "../types";

const HISTORY = 300;

function Cell(props: { v: number | null | undefined; limit?: number | null; testid?: string }) {
  return (
    <td className={`slo-${sloClass(props.v, props.limit ?? null)}`} data-testid={props.testid}>
      {ms(props.v)}
    </td>
  );
}

export function LiveTable(props: { stats: LiveStats | null; config: DashboardConfig | null }) {
  const { stats, config } = props;
  const w = stats?.window.summary;
  const base = nearest(config?.baseline?.points, stats?.concurrency ?? 0);
  const rows: { name: string; live?: { p50: number | null; p95: number | null }; base?: P50P95; limit: number | null }[] = [
    { name: "TTFT", live: w?.ttft_ms, base: base?.ttft_ms, limit: config?.slo_ttft_p95_ms ?? null },
    { name: "TPOT", live: w?.tpot_ms, base: base?.tpot_ms, limit: config?.slo_tpot_p95_ms ?? null },
    { name: "ITL", live: w?.itl_ms, base: base?.itl_ms, limit: null },
    { name: "Latency", live: w?.e2e_ms, base: base?.e2e_ms, limit: null },
  ];
  return (
    <table className="live-table">
      <thead>
        <tr>
          <th>metric</th>
          <th>live p50</th>
          <th>{base ? `baseline p50 (c${base.concurrency})` : "baseline p50"}</th>
          <th>live p95</th>
          <th>baseline p95</th>
          <th>p95 improvement</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => (
          <tr key={r.name}>
            <th>{r.name}</th>
            <Cell v={r.live?.p50} limit={r.limit} testid={`live-${r.name}-p50`} />
            <Cell v={r.base?.p50} limit={r.limit} />
            <Cell v={r.live?.p95} limit={r.limit} testid={`live-${r.name}-p95`} />
            <Cell v={r.base?.p95} limit={r.limit} />
            <td>{improvement(r.live?.p95, r.base?.p95)}</td>
          </tr>
        ))}
        <tr>
          <th>Failed / shed</th>
          <td colSpan={5} className={(stats?.window.summary.failed ?? 0) + (stats?.window.summary.rejected ?? 0) > 0 ? "slo-bad" : ""}>
            {w ? `${w.failed} failed, ${w.rejected} shed of ${w.sent} sent in the window` : "—"}
            {w && w.sent > 0 && (w.failed > 0 || w.rejected > 0)
              ? ` — TTFT p95 over all sent: ${ms(w.ttft_all_ms.p95 as number | string | null)}`
              : ""}
          </td>
        </tr>
      </tbody>
    </table>
  );
}

export function BaselineTable(props: { stats: LiveStats | null; config: DashboardConfig | null }) {
  const { stats, config } = props;
  const b = config?.baseline;
  if (!b) {
    return <p className="muted">No baseline file: start the demo with its default fleet, or give `--baseline FILE` (written by `kvroute bench`).</p>;
  }
  const live = stats?.window.summary;
  return (
    <>
      <p className="muted">
        {b.policy} on {b.workers} workers, {b.workload} — {b.source}
      </p>
      <table className="baseline-table">
        <thead>
          <tr>
            <th>concurrency</th>
            <th>TTFT p95</th>
            <th>TPOT p95</th>
            <th>ITL p95</th>
            <th>latency p95</th>
            <th>RPS</th>
            <th>output tok/s</th>
            <th>KV hit</th>
            <th>live TTFT p95 (improvement)</th>
          </tr>
        </thead>
        <tbody>
          {b.points.map((p) => {
            const here = stats !== null && p.concurrency === stats.concurrency && (live?.completed ?? 0) > 0;
            return (
              <tr key={p.concurrency} className={here ? "current" : ""}>
                <th>{p.concurrency}</th>
                <Cell v={p.ttft_ms.p95} limit={config?.slo_ttft_p95_ms} />
                <Cell v={p.tpot_ms.p95} limit={config?.slo_tpot_p95_ms} />
                <Cell v={p.itl_ms.p95} />
                <Cell v={p.e2e_ms.p95} />
                <td>{num(p.requests_per_s, 2)}</td>
                <td>{num(p.output_tokens_per_s)}</td>
                <td>{pct(p.hit_rate)}</td>
                <td>{here ? `${ms(live?.ttft_ms.p95)} (${improvement(live?.ttft_ms.p95, p.ttft_ms.p95)})` : ""}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
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
  return (
    <div className="workers">
      {f.workers.map((w) => (
        <div key={w.name} className={`worker${w.up ? "" : " down"}`} data-testid="worker-card">
          <h4>
            {w.name} <span className="muted">{w.up ? "up" : "down"}</span>
          </h4>
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
  );
}

export function Dashboard(props: { stats: LiveStats | null; config: DashboardConfig | null }) {
  const { stats, config } = props;
  const { data: fleet } = usePoll<Fleet>("/api/fleet", 2000);
  const [ttft, setTtft] = useState<Point[]>([]);
  const [tpot, setTpot] = useState<Point[]>([]);
  useEffect(() => {
    if (!stats) return;
    const t = stats.time_unix_ms;
    const add = (v: number | null) => (h: Point[]) => [...h.slice(-(HISTORY - 1)), { t, v }];
    setTtft(add(stats.window.summary.ttft_ms.p95));
    setTpot(add(stats.window.summary.tpot_ms.p95));
  }, [stats]);
  const setConcurrency = useCallback((n: number) => {
    void control("/api/concurrency", { concurrency: n });
  }, []);
  const w = stats?.window.summary;
  const has = (w?.sent ?? 0) > 0;
  const errors = (stats?.totals.failed ?? 0) + (stats?.totals.rejected ?? 0);
  // The gateway's admission queue, as in the reference; else what waits in the workers.
  const queued = !fleet?.available
    ? null
    : (fleet.queued ?? fleet.workers.reduce((s, x) => s + (x.waiting ?? 0), 0));
  return (
    <div className="dashboard">
      <section>
        <h2>Live vs round-robin baseline</h2>
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
        <Kpi label="RPS" value={has ? num(w?.requests_per_s, 2) : "—"} hint="completed requests per second, last 60 s" />
        <Kpi label="Requests" value={stats && stats.totals.sent > 0 ? num(stats.totals.sent) : "—"} hint="since Start" />
        <Kpi label="Output tokens/s" value={has ? num(w?.output_tokens_per_s) : "—"} />
        <Kpi label="KV cache hit" value={has ? pct(w?.hit_rate) : "—"} hint="cached / prompt tokens, last 60 s" />
        <Kpi label="Queued" value={queued === null ? "—" : num(queued)} hint="requests waiting in the gateway's admission queue" />
        <Kpi label="Errors" value={stats && stats.totals.sent > 0 ? num(errors) : "—"} alert={errors > 0} hint="failed + shed since Start" />
      </section>
      <section className="charts">
        <LiveChart title="TTFT p95 (60 s window)" points={ttft} limit={config?.slo_ttft_p95_ms ?? null} unit="ms" />
        <LiveChart title="TPOT p95 (60 s window)" points={tpot} limit={config?.slo_tpot_p95_ms ?? null} unit="ms" />
      </section>
      <section>
        <h2>Workers {fleet?.policy ? <span className="muted">— policy {fleet.policy}</span> : null}</h2>
        <WorkerCards fleet={fleet} />
      </section>
      <section>
        <h2>Benchmark: round-robin baseline by concurrency</h2>
        <BaselineTable stats={stats} config={config} />
      </section>
    </div>
  );
}
