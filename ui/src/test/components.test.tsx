import { act, fireEvent, render, screen } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { Kpi } from "../components/Kpi";
import { ConcurrencySlider } from "../components/Slider";
import { RouteTable, TurnWorkers } from "../pages/ConversationPage";
import { LiveTable, ModelPicker, Refusals, WorkerCards, accuracyText, addClassPoints } from "../pages/Dashboard";
import type { AccuracyCard, ArmStats, DashboardConfig, Fleet, FleetsAnswer, LiveStats } from "../types";

const dist = (p50: number | null, p95: number | null) => ({ count: 10, mean: p50, p50, p90: p95, p95, p99: p95 });

function arm(name: string, baseline: boolean, ttftP95: number, failed = 1): ArmStats {
  return {
    name,
    target: "http://127.0.0.1:8000",
    baseline,
    active_conversations: 80,
    totals: { sent: 10, completed: 9, failed, rejected: 0, cancelled: 0, in_flight: 3, input_tokens: 1, cached_tokens: 1, output_tokens: 1 },
    window: {
      span_secs: 60,
      covered_secs: 60,
      overflowed: 0,
      summary: {
        sent: 10, completed: 9, failed, rejected: 0, failed_by_reason: { stream_broken: 1 }, rejected_by_reason: {},
        duration_secs: 60, ttft_ms: dist(300, ttftP95), ttft_all_ms: { p50: 300, p95: "inf", p99: "inf" },
        tpot_ms: dist(20, 55), itl_ms: dist(19, 30), e2e_ms: dist(9000, 12000), input_tokens: 100, cached_tokens: 60,
        predicted_cached_tokens: 60, output_tokens: 50, hit_rate: 0.6, prediction_ratio: 1, prediction_error: 0,
        output_tokens_per_s: 120, requests_per_s: 0.15, goodput: null,
      },
    },
  };
}

function stats(over: Partial<LiveStats> = {}): LiveStats {
  return {
    time_unix_ms: 0,
    running: true,
    stopping: false,
    concurrency: 80,
    pending_concurrency: null,
    max_concurrency: 100000,
    level_secs: 100,
    measure_after_secs: 90,
    rate: null,
    model: "kvroute-sim",
    workload: "multiturn",
    runs: 1,
    arms: [arm("goodput", false, 700)],
    ...over,
  };
}

const point = (c: number, ttft95: number, tpot95: number) => ({
  concurrency: c, ttft_ms: { p50: 400, p95: ttft95 }, tpot_ms: { p50: 21, p95: tpot95 }, itl_ms: { p50: 20, p95: 31 },
  e2e_ms: { p50: 9500, p95: 13000 }, requests_per_s: 1, output_tokens_per_s: 800, hit_rate: 0.3,
});

const config: DashboardConfig = {
  slo_ttft_p95_ms: 600,
  slo_tpot_p95_ms: 60,
  slider_min: 60,
  slider_max: 180,
  slider_step: 20,
  baselines: [
    { format: "kvroute-baseline", version: 1, policy: "round_robin", workers: 3, workload: "multiturn", source: "test", simulated: false, points: [60, 80].map((c) => point(c, 900, 58)) },
  ],
};

describe("KPI cards", () => {
  it("show a dash without data and turn red when flagged", () => {
    render(<Kpi label="Errors" value="—" />);
    expect(screen.getByTestId("kpi-Errors").textContent).toContain("—");
    render(<Kpi label="Failures" value="3" alert />);
    expect(screen.getByTestId("kpi-Failures").className).toContain("kpi-alert");
  });
});

describe("the live vs baseline table", () => {
  it("colours p95 against the objectives and compares with the baseline", () => {
    render(<LiveTable stats={stats()} config={config} />);
    // TTFT p95 700 > 600: red; TPOT p95 55 within 90% of 60: yellow; p50s green.
    expect(screen.getByTestId("live-TTFT-p95").className).toBe("slo-bad");
    expect(screen.getByTestId("live-TPOT-p95").className).toBe("slo-warn");
    expect(screen.getByTestId("live-TTFT-p50").className).toBe("slo-ok");
    expect(screen.getByTestId("live-ITL-p95").className).toBe("slo-none");
    // 700 against the recorded baseline's 900 at concurrency 80.
    expect(screen.getByText("+22.2%")).toBeTruthy();
    expect(screen.getByText(/1 failed, 0 shed of 10 sent/)).toBeTruthy();
    expect(screen.getByText(/round_robin \(recorded, c80\) p95/)).toBeTruthy();
    // Over all sent, one failure makes the p95 infinite.
    expect(screen.getByTestId("live-TTFT-all-p95").textContent).toBe("∞");
  });
  it("compares two live arms when the baseline fleet runs", () => {
    render(<LiveTable stats={stats({ arms: [arm("goodput", false, 400), arm("round_robin", true, 800, 0)] })} config={config} />);
    expect(screen.getByTestId("base-TTFT-p95").textContent).toBe("800 ms");
    expect(screen.getByTestId("improvement-TTFT").textContent).toBe("+50.0%");
    expect(screen.getByTestId("failures").textContent).toContain("round_robin: 0 failed");
  });
  it("shows dashes before any data and after Stop", () => {
    render(<LiveTable stats={null} config={null} />);
    expect(screen.getByTestId("live-TTFT-p95").textContent).toBe("—");
  });
  it("is cleared once the load stopped", () => {
    render(<LiveTable stats={stats({ running: false })} config={config} />);
    expect(screen.getByTestId("live-TTFT-p95").textContent).toBe("—");
    expect(screen.getByTestId("base-TTFT-p95").textContent).toBe("—");
  });
});

describe("the comparison table", () => {
  it("prefers live levels, then recorded, then simulated references, labelled", async () => {
    const { ComparisonTable } = await import("../pages/Dashboard");
    const withSim: DashboardConfig = {
      ...config,
      baselines: [
        ...config.baselines,
        { format: "kvroute-baseline", version: 1, policy: "goodput", workers: 3, workload: "multiturn", source: "sim", simulated: true, points: [60, 80, 100].map((c) => point(c, 450, 40)) },
      ],
    };
    const levels = [
      {
        concurrency: 60,
        arms: [
          { name: "goodput", baseline: false, held_secs: 95, taken_unix_ms: 1, summary: arm("goodput", false, 300).window.summary },
          { name: "round_robin", baseline: true, held_secs: 95, taken_unix_ms: 1, summary: arm("round_robin", true, 600).window.summary },
        ],
      },
    ];
    const live = stats({ arms: [arm("goodput", false, 400), arm("round_robin", true, 800)] });
    render(<ComparisonTable stats={live} config={withSim} levels={levels} />);
    const rows = screen.getAllByTestId("comparison-row");
    expect(rows.length).toBe(7);
    // 60: both live; 300 against 600 ms.
    expect(rows[0].textContent).toContain("+50.0%");
    expect(rows[0].textContent).toContain("live");
    // 80: round-robin recorded 900, goodput simulated 450.
    expect(rows[1].textContent).toContain("900 ms");
    expect(rows[1].textContent).toContain("simulated");
    // 120: nothing for either side.
    expect(rows[3].textContent).toContain("—");
    expect(screen.getAllByTestId("save-baseline").length).toBe(2);
  });
});

describe("the live chart", () => {
  it("keeps its axis labels inside the drawing", async () => {
    const { LiveChart, tickLabel, labelPad } = await import("../components/LiveChart");
    expect(tickLabel(17566)).toBe("18k");
    expect(tickLabel(1250)).toBe("1.3k");
    expect(tickLabel(720)).toBe("720");
    // The label's width fits left of the axis.
    expect(labelPad("1.3k")).toBeGreaterThanOrEqual(4 * 6 + 4);
    render(
      <LiveChart
        title="TTFT"
        limit={600}
        unit="ms"
        series={[
          { name: "a", className: "series", points: [{ t: 0, v: 17566 }, { t: 1000, v: 100 }] },
          { name: "b", className: "series-baseline", points: [{ t: 0, v: 10 }] },
        ]}
      />,
    );
    expect(screen.getByTestId("y-top").textContent).toBe("18k");
    expect(Number(screen.getByTestId("y-top").getAttribute("x"))).toBeGreaterThanOrEqual(24);
    expect(screen.getByTestId("line-b")).toBeTruthy();
  });
});

describe("offline", () => {
  it("says in words that the load generator does not answer", async () => {
    const { humanError } = await import("../api");
    expect(humanError(new TypeError("Failed to fetch"))).toMatch(/does not answer/);
    expect(humanError(new TypeError("Failed to fetch"))).not.toMatch(/TypeError/);
  });
});

describe("the concurrency slider", () => {
  it("sends only the last position, 300 ms after the last move", () => {
    vi.useFakeTimers();
    const sent: number[] = [];
    render(<ConcurrencySlider min={60} max={180} step={20} applied={60} pending={null} onChange={(n) => sent.push(n)} />);
    const input = screen.getByRole("slider");
    fireEvent.change(input, { target: { value: "80" } });
    fireEvent.change(input, { target: { value: "120" } });
    expect(screen.getByTestId("slider-value").textContent).toBe("120");
    act(() => {
      vi.advanceTimersByTime(299);
    });
    expect(sent).toEqual([]);
    act(() => {
      vi.advanceTimersByTime(1);
    });
    expect(sent).toEqual([120]);
    vi.useRealTimers();
  });
});

describe("worker cards", () => {
  it("say when the target does not list its workers", () => {
    render(<WorkerCards fleet={{ available: false, error: "not a kvroute gateway", policy: null, queued: null, workers: [], pools: [], classes: [], refusals: [], models: [], pool: null }} />);
    expect(screen.getByText(/not a kvroute gateway/)).toBeTruthy();
  });
});

describe("worker accuracy", () => {
  const card = (accuracy: AccuracyCard | null) => ({
    name: "w1", url: "http://w1", up: true, role: "both", engine: "vLLM", model: "llama", inflight: 0, index_blocks: 10, kv_usage: 0.1, busy: 0.2,
    queue_time_secs: 0, running: 0, waiting: 0, cache_state: "exact", accuracy,
  });
  it("shows the share of exact predictions, the error and a degraded verdict", () => {
    const a = { samples: 32, exact_ratio: 0.5, mean_abs_error_tokens: 48, over: 16, under: 0, degraded: "over_predicting", repairs: 1 };
    expect(accuracyText(a)).toBe("50.0% of 32 (±48 tok) — over predicting");
    expect(accuracyText({ ...a, exact_ratio: 1, mean_abs_error_tokens: 0, degraded: null })).toBe("100.0% of 32");
    expect(accuracyText(null)).toBe("—");
    render(<WorkerCards fleet={{ available: true, error: null, policy: "kv", queued: 0, workers: [card(a)], pools: [{ role: "both", workers: 1, inflight: 0, prefill_tokens: 0 }], classes: [], refusals: [], models: [], pool: null }} />);
    const cell = screen.getByTestId("prediction-accuracy");
    // One pool of workers doing both: no pool line, no role badge.
    expect(screen.queryByTestId("pools")).toBeNull();
    expect(screen.queryByTestId("worker-role")).toBeNull();
    expect(cell.textContent).toContain("over predicting");
    expect(cell.className).toBe("slo-bad");
    expect(screen.getByTestId("worker-engine").textContent).toBe("vLLM · llama");
  });
});

describe("a disaggregated fleet's cards", () => {
  it("show each worker's role and each pool's load", () => {
    const card = (name: string, role: string) => ({
      name, url: `http://${name}`, up: true, role, engine: null, model: null, inflight: 1, index_blocks: 0, kv_usage: null, busy: null,
      queue_time_secs: null, running: null, waiting: null, cache_state: "exact", accuracy: null,
    });
    const pools = [
      { role: "decode", workers: 2, inflight: 5, prefill_tokens: 0 },
      { role: "prefill", workers: 1, inflight: 2, prefill_tokens: 900 },
    ];
    render(<WorkerCards fleet={{ available: true, error: null, policy: "goodput", queued: 0, workers: [card("p1", "prefill"), card("d1", "decode"), card("d2", "decode")], pools, classes: [], refusals: [], models: [], pool: null }} />);
    expect(screen.getAllByTestId("worker-role").map((e) => e.textContent)).toEqual(["prefill", "decode", "decode"]);
    const lines = screen.getAllByTestId("pool").map((e) => e.textContent);
    expect(lines).toEqual(["decode: 2 workers, 5 in flight, 0 prefill tokens", "prefill: 1 worker, 2 in flight, 900 prefill tokens"]);
  });
});

describe("a turn's workers", () => {
  it("name the prefill worker when another computed the prompt", () => {
    const { container, rerender } = render(<TurnWorkers worker="decode-1" prefill="prefill-1" />);
    expect(container.textContent).toBe("decode-1 (prefilled on prefill-1)");
    rerender(<TurnWorkers worker="w2" prefill={null} />);
    expect(container.textContent).toBe("w2");
    rerender(<TurnWorkers worker={null} prefill={null} />);
    expect(container.textContent).toBe("—");
  });
});

describe("a turn's routing explanation", () => {
  it("lists every worker's terms with the chosen one marked", () => {
    const route = {
      policy: "kv", prompt_tokens: 700, block_size: 16, omitted: 2,
      workers: [
        { name: "a", matched_blocks: 40, host_blocks: 0, disk_blocks: 0, uncached_tokens: 60, inflight: 1, prefill_tokens: 0, busy: false, eligible: true, cost: 3.75, chosen: true },
        { name: "b", matched_blocks: 0, host_blocks: 0, disk_blocks: 0, uncached_tokens: 700, inflight: 0, prefill_tokens: 0, busy: false, eligible: true, cost: 43.75, chosen: false },
        { name: "c", matched_blocks: 2, host_blocks: 5, disk_blocks: 1, uncached_tokens: 572, inflight: 0, prefill_tokens: 0, busy: false, eligible: true, cost: 50.1, chosen: false },
      ],
    };
    render(<RouteTable route={route} cached={640} />);
    const rows = screen.getAllByTestId("route-worker");
    expect(rows.length).toBe(3);
    expect(rows[0].className).toBe("chosen");
    expect(rows[0].textContent).toContain("40 blocks · 640 tok");
    expect(rows[0].textContent).not.toContain("from host");
    expect(rows[2].textContent).toContain("2 blocks · 32 tok + 5 from host, 1 from disk");
    expect(rows[1].textContent).toContain("43.75");
    expect(screen.getByText(/2 more workers/)).toBeTruthy();
    expect(screen.getByText(/reported 640 cached tokens/)).toBeTruthy();
  });
});

describe("the how-it-works diagram", () => {
  it("draws the served turn's cached share and the worker that served it", async () => {
    const { PromptBlocks } = await import("../pages/HowItWorks");
    const turn = {
      turn: 3, status: "completed", error: null, ttft_ms: 20, itl_ms: 10, tpot_ms: 10, latency_ms: 900,
      input_tokens: 1000, cached_tokens: 750, predicted_cached_tokens: 750, output_tokens: 80,
      worker: "worker-2", prefill_worker: null, route: null, user: "q", assistant: "a",
    };
    const { container } = render(<PromptBlocks turn={turn} workers={["worker-1", "worker-2"]} policy="predictive" />);
    expect(container.querySelectorAll("rect.block.hit").length).toBe(12);
    expect(screen.getAllByTestId("how-worker").length).toBe(2);
    expect(screen.getByText(/chosen by predictive/).textContent).toContain("250 new tokens");
  });
});

describe("flow control on the dashboard", () => {
  const fleet = (classes: Fleet["classes"], refusals: Fleet["refusals"]): Fleet => ({
    available: true, error: null, policy: "goodput", queued: 0, workers: [], pools: [], classes, refusals, models: [], pool: null,
  });
  const answer = (arms: [string, Fleet][]): FleetsAnswer => ({
    arms: arms.map(([arm, f]) => ({ arm, target: `http://${arm}`, baseline: false, fleet: f })),
  });
  it("draws a line per class only for a fleet with several classes", () => {
    const two = [
      { class: "interactive", requests: 4, ttft_p50_ms: 90, ttft_p95_ms: 120 },
      { class: "batch", requests: 0, ttft_p50_ms: null, ttft_p95_ms: null },
    ];
    const one = [{ class: "default", requests: 9, ttft_p50_ms: 200, ttft_p95_ms: 300 }];
    let h = addClassPoints({}, answer([["goodput", fleet(two, [])], ["round_robin", fleet(one, [])]]), 1000);
    expect(Object.keys(h)).toEqual(["goodput · interactive", "goodput · batch"]);
    h = addClassPoints(h, answer([["goodput", fleet(two, [])]]), 2000);
    expect(h["goodput · interactive"]).toEqual([{ t: 1000, v: 120 }, { t: 2000, v: 120 }]);
    expect(h["goodput · batch"]).toEqual([{ t: 1000, v: null }, { t: 2000, v: null }]);
    // A read without classes keeps the lines, with a gap.
    h = addClassPoints(h, answer([["goodput", fleet([], [])]]), 3000);
    expect(h["goodput · interactive"]).toEqual([{ t: 1000, v: 120 }, { t: 2000, v: 120 }, { t: 3000, v: null }]);
  });
  it("lists refusals by tenant, the most first, and nothing when there are none", () => {
    const { container, rerender } = render(<Refusals fleets={answer([["goodput", fleet([], [])]])} />);
    expect(container.textContent).toBe("");
    const refusals = [
      { tenant: "a", class: "standard", reason: "queue_full", total: 2, window: 1 },
      { tenant: "flood", class: "standard", reason: "tenant_limit", total: 40, window: 12 },
      { tenant: "default", class: "standard", reason: "shed", total: 0, window: 0 },
    ];
    rerender(<Refusals fleets={answer([["goodput", fleet([], refusals)]])} />);
    const rows = screen.getAllByTestId("refusal-row").map((r) => r.textContent);
    expect(rows).toEqual(["goodputfloodstandardtenant_limit1240", "goodputastandardqueue_full12"]);
  });
});

describe("the model picker", () => {
  it("shows only for a gateway serving several models, locked while the load runs", () => {
    const { container, rerender } = render(<ModelPicker stats={stats({ running: false })} models={["kvroute-sim"]} />);
    expect(container.querySelector("select")).toBeNull();
    rerender(<ModelPicker stats={stats({ running: false })} models={["kvroute-sim", "kvroute-sim-2"]} />);
    const select = screen.getByTestId("model-select") as HTMLSelectElement;
    expect(select.value).toBe("kvroute-sim");
    expect(select.disabled).toBe(false);
    expect([...select.options].map((o) => o.value)).toEqual(["kvroute-sim", "kvroute-sim-2"]);
    rerender(<ModelPicker stats={stats({ running: true })} models={["kvroute-sim", "kvroute-sim-2"]} />);
    expect((screen.getByTestId("model-select") as HTMLSelectElement).disabled).toBe(true);
    expect(screen.getByText(/stop the load to change it/)).toBeTruthy();
  });
});
