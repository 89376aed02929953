import { act, fireEvent, render, screen } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { Kpi } from "../components/Kpi";
import { ConcurrencySlider } from "../components/Slider";
import { RouteTable } from "../pages/ConversationPage";
import { LiveTable, WorkerCards, accuracyText } from "../pages/Dashboard";
import type { AccuracyCard, DashboardConfig, LiveStats } from "../types";

const dist = (p50: number | null, p95: number | null) => ({ count: 10, mean: p50, p50, p90: p95, p95, p99: p95 });

function stats(over: Partial<LiveStats> = {}): LiveStats {
  return {
    time_unix_ms: 0,
    running: true,
    stopping: false,
    concurrency: 80,
    pending_concurrency: null,
    max_concurrency: 100000,
    rate: null,
    workload: "multiturn",
    target: "http://127.0.0.1:8000",
    runs: 1,
    active_conversations: 80,
    totals: { sent: 10, completed: 9, failed: 1, rejected: 0, cancelled: 0, in_flight: 3, input_tokens: 1, cached_tokens: 1, output_tokens: 1 },
    window: {
      span_secs: 60,
      covered_secs: 60,
      overflowed: 0,
      summary: {
        sent: 10, completed: 9, failed: 1, rejected: 0, failed_by_reason: { stream_broken: 1 }, rejected_by_reason: {},
        duration_secs: 60, ttft_ms: dist(300, 700), ttft_all_ms: { p50: 300, p95: "inf", p99: "inf" },
        tpot_ms: dist(20, 55), itl_ms: dist(19, 30), e2e_ms: dist(9000, 12000), input_tokens: 100, cached_tokens: 60,
        output_tokens: 50, hit_rate: 0.6, output_tokens_per_s: 120, requests_per_s: 0.15,
      },
    },
    ...over,
  };
}

const config: DashboardConfig = {
  slo_ttft_p95_ms: 600,
  slo_tpot_p95_ms: 60,
  slider_min: 60,
  slider_max: 180,
  slider_step: 20,
  baseline: {
    policy: "round_robin", workers: 3, workload: "multiturn", source: "test",
    points: [60, 80].map((c) => ({
      concurrency: c, ttft_ms: { p50: 400, p95: 900 }, tpot_ms: { p50: 21, p95: 58 }, itl_ms: { p50: 20, p95: 31 },
      e2e_ms: { p50: 9500, p95: 13000 }, requests_per_s: 1, output_tokens_per_s: 800, hit_rate: 0.3,
    })),
  },
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
    // 700 against the baseline's 900 at concurrency 80.
    expect(screen.getByText("+22.2%")).toBeTruthy();
    expect(screen.getByText(/1 failed, 0 shed of 10 sent/)).toBeTruthy();
  });
  it("shows dashes before any data", () => {
    render(<LiveTable stats={null} config={null} />);
    expect(screen.getByTestId("live-TTFT-p95").textContent).toBe("—");
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
    render(<WorkerCards fleet={{ available: false, error: "not a kvroute gateway", policy: null, queued: null, workers: [] }} />);
    expect(screen.getByText(/not a kvroute gateway/)).toBeTruthy();
  });
});

describe("worker accuracy", () => {
  const card = (accuracy: AccuracyCard | null) => ({
    name: "w1", url: "http://w1", up: true, inflight: 0, index_blocks: 10, kv_usage: 0.1, busy: 0.2,
    queue_time_secs: 0, running: 0, waiting: 0, cache_state: "exact", accuracy,
  });
  it("shows the share of exact predictions, the error and a degraded verdict", () => {
    const a = { samples: 32, exact_ratio: 0.5, mean_abs_error_tokens: 48, over: 16, under: 0, degraded: "over_predicting", repairs: 1 };
    expect(accuracyText(a)).toBe("50.0% of 32 (±48 tok) — over predicting");
    expect(accuracyText({ ...a, exact_ratio: 1, mean_abs_error_tokens: 0, degraded: null })).toBe("100.0% of 32");
    expect(accuracyText(null)).toBe("—");
    render(<WorkerCards fleet={{ available: true, error: null, policy: "kv", queued: 0, workers: [card(a)] }} />);
    const cell = screen.getByTestId("prediction-accuracy");
    expect(cell.textContent).toContain("over predicting");
    expect(cell.className).toBe("slo-bad");
  });
});

describe("a turn's routing explanation", () => {
  it("lists every worker's terms with the chosen one marked", () => {
    const route = {
      policy: "kv", prompt_tokens: 700, block_size: 16, omitted: 2,
      workers: [
        { name: "a", matched_blocks: 40, uncached_tokens: 60, inflight: 1, prefill_tokens: 0, busy: false, eligible: true, cost: 3.75, chosen: true },
        { name: "b", matched_blocks: 0, uncached_tokens: 700, inflight: 0, prefill_tokens: 0, busy: false, eligible: true, cost: 43.75, chosen: false },
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
      worker: "worker-2", route: null, user: "q", assistant: "a",
    };
    const { container } = render(<PromptBlocks turn={turn} workers={["worker-1", "worker-2"]} policy="predictive" />);
    expect(container.querySelectorAll("rect.block.hit").length).toBe(12);
    expect(screen.getAllByTestId("how-worker").length).toBe(2);
    expect(screen.getByText(/chosen by predictive/).textContent).toContain("250 new tokens");
  });
});
