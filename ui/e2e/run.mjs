// End-to-end test of the dashboard in headless Chromium: starts `kvroute demo` (the live A/B:
// two identical fleets, one behind round-robin), opens the UI, presses Start, waits for the
// KPIs and both arms' figures to fill, moves the slider and sees the load change on both, sees
// each worker's engine and prediction accuracy, the chart's axis labels inside the drawing, a
// level measured live in the comparison table, opens a conversation and the routing
// explanation of its second turn, the how-it-works example while the load runs, stops (cards
// cleared), then ends the demo and sees a sentence, not a TypeError; saves a screenshot of
// every page into docs/screenshots/. The demo's gateways have two classes and a capped tenant
// (flow control): requests of the other class draw its line on the TTFT chart, and the capped
// tenant's refusals show in the refusals table.
//
// The demo runs small here (its slider at 8-24 conversations, levels measured after 20 s) so
// a debug build on two cores finishes; KVROUTE_E2E_FULL=1 runs the default demo instead (for
// the documentation's pictures, with KVROUTE_E2E_SETTLE_SECS).
//
// KVROUTE_BIN and CHROMIUM as in demo.mjs.
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { resolve } from "node:path";
import { fail, launchBrowser, shots, startDemo as start_, status, until } from "./demo.mjs";

const full = process.env.KVROUTE_E2E_FULL === "1";

/** The demo gateways' flow settings: the load's requests are `standard`; `interactive` is
 * a higher band; the tenant of key `sk-capped` has a bucket of one token a second. */
const FLOW_CONFIG = `
[router.admission.flow]
default_class = "standard"

[[router.admission.flow.classes]]
name = "standard"

[[router.admission.flow.classes]]
name = "interactive"
band = 1

[[router.admission.flow.tenants]]
name = "capped"
tokens_per_sec = 1.0
burst_tokens = 1
api_keys = ["sk-capped"]
`;

/** Starts the demo with the flow settings (small unless KVROUTE_E2E_FULL=1). */
function startDemo() {
  const small = ["--slider-min", "8", "--slider-max", "24", "--slider-step", "8", "--measure-after-secs", "20"];
  const config = resolve(mkdtempSync(resolve(tmpdir(), "kvroute-e2e-")), "gateway.toml");
  writeFileSync(config, FLOW_CONFIG);
  return start_(["--config", config, ...(full ? [] : small)]);
}

const { demo, url } = startDemo();
let browser;
try {
  const base = await url;
  browser = await launchBrowser();
  const page = await browser.newPage({ viewport: { width: 1360, height: 1500 } });
  page.on("pageerror", (e) => fail(`page error: ${e}`));
  await page.goto(`${base}/`);
  await page.getByText("Serve More Users on the Same GPUs with KV-Aware Routing").waitFor();

  // Connected and stopped: Start enabled, Stop disabled.
  const start = page.getByRole("button", { name: "Start" });
  const stop = page.getByRole("button", { name: "Stop" });
  await page.locator(".conn-open").waitFor({ timeout: 20_000 });
  if (!(await start.isEnabled()) || (await stop.isEnabled())) fail("Start/Stop not enabled as stopped");
  if ((await page.getByTestId("kpi-RPS").textContent()).indexOf("—") < 0) fail("RPS shown before any data");

  // Start: the buttons flip, the KPIs fill.
  await start.click();
  await until("Stop enabled", 20, () => stop.isEnabled());
  if (await start.isEnabled()) fail("Start still enabled while running");
  await until("the KPIs to fill", 120, async () => {
    const rps = await page.getByTestId("kpi-RPS").locator(".kpi-value").textContent();
    const hit = await page.getByTestId("kpi-KV cache hit").locator(".kpi-value").textContent();
    return rps !== "—" && hit !== "—";
  });
  await until("a TTFT p95 figure", 30, async () => (await page.getByTestId("live-TTFT-p95").textContent()) !== "—");
  // Both arms live: the baseline column is the round-robin fleet, measured now.
  await until("the baseline arm's TTFT p95", 60, async () => (await page.getByTestId("base-TTFT-p95").textContent()) !== "—");
  const header = await page.locator(".live-table thead").textContent();
  if (!/goodput p50/.test(header) || !/round_robin p50/.test(header)) fail(`the live table compares ${header}`);
  if ((await page.getByTestId("improvement-TTFT").textContent()) === "—") fail("no TTFT improvement shown");
  if ((await page.getByTestId("kpi-vs-RPS").count()) !== 1) fail("the KPI cards do not show the baseline arm");
  // The chart's y-axis label lies inside the drawing (it was clipped at 5 digits).
  for (const label of await page.getByTestId("y-top").all()) {
    const [box, svg] = [await label.boundingBox(), await label.locator("xpath=..").boundingBox()];
    if (!box || !svg || box.x < svg.x) fail(`a chart's axis label starts outside its drawing: ${JSON.stringify([box, svg])}`);
  }

  // The slider: the load generator runs at the new level, on both fleets.
  const level = full ? 80 : 16;
  await page.getByRole("slider").fill(String(level));
  await until(`concurrency ${level}`, 20, async () => (await status(base)).concurrency === level);
  await until(`${level} conversations on each arm`, 90, async () =>
    (await status(base)).arms.every((a) => a.active_conversations >= level - Math.ceil(level / 8)),
  );
  await until("the workers' cards", 20, async () => (await page.getByTestId("worker-card").count()) === 6);
  if ((await page.getByTestId("arm-workers").count()) !== 2) fail("the workers are not grouped by arm");
  for (const e of await page.getByTestId("worker-engine").allTextContents()) {
    if (!/kvroute simulated \(demo\) · kvroute-sim/.test(e)) fail(`a worker card names ${e}`);
  }
  // Each card: the gateway's trust in its index and how exactly it predicted the cache.
  await until("every worker's prediction accuracy", 30, async () => {
    const cells = await page.getByTestId("prediction-accuracy").allTextContents();
    return cells.length === 6 && cells.every((c) => /% of \d/.test(c));
  });
  for (const state of await page.getByTestId("cache-state").allTextContents()) {
    if (state !== "exact") fail(`a worker's index is ${state}, not exact`);
  }
  // For the documentation's pictures, let the load settle (KVROUTE_E2E_SETTLE_SECS).
  const settle = Number(process.env.KVROUTE_E2E_SETTLE_SECS ?? "3");
  await page.waitForTimeout(settle * 1000);
  await page.screenshot({ path: resolve(shots, "dashboard.png"), fullPage: true });

  // Flow control: requests of the `interactive` class on the candidate's gateway draw that
  // class's line on the TTFT chart; the capped tenant's second and third requests are
  // refused (429 tenant_limit) and listed by tenant.
  const fleet = await (await fetch(`${base}/api/fleet`)).json();
  const gateway = fleet.arms.find((a) => !a.baseline)?.target ?? fail(`no candidate arm in ${JSON.stringify(fleet)}`);
  const ask = (headers) =>
    fetch(`${gateway}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ model: "kvroute-sim", messages: [{ role: "user", content: "Say hello." }], max_tokens: 4 }),
    });
  for (let i = 0; i < 3; i++) {
    const r = await ask({ "x-kvroute-class": "interactive" });
    if (r.status !== 200) fail(`an interactive request got ${r.status}: ${await r.text()}`);
  }
  const capped = [];
  for (let i = 0; i < 3; i++) capped.push((await ask({ authorization: "Bearer sk-capped" })).status);
  if (capped[0] !== 200 || !capped.slice(1).every((c) => c === 429)) fail(`the capped tenant got ${capped}`);
  await until("the interactive class's line", 30, async () =>
    (await page.locator(".chart figcaption").first().textContent()).includes("· interactive"),
  );
  await until("the capped tenant's refusals", 30, async () => {
    const rows = await page.getByTestId("refusal-row").allTextContents();
    return rows.some((r) => r.includes("capped") && r.includes("tenant_limit"));
  });
  await page.screenshot({ path: resolve(shots, "dashboard-flow.png"), fullPage: true });

  // The comparison table: a level both arms held long enough is measured live.
  const rows = page.getByTestId("comparison-row");
  const live = rows.filter({ hasText: /live/ });
  await until("a level measured live", 150, async () => (await live.count()) > 0);
  const cells = await live.first().locator("td").allTextContents();
  if (cells.length !== 8 || cells.slice(0, 2).some((c) => c === "—")) fail(`the live row reads ${cells}`);
  if ((await page.getByTestId("save-baseline").count()) !== 2) fail("no baseline file to save for both arms");
  const file = await (await fetch(`${base}/api/baseline?arm=round_robin`)).json();
  if (file.format !== "kvroute-baseline" || file.points.length === 0) fail(`/api/baseline: ${JSON.stringify(file)}`);

  // Conversations: the list, then one conversation with its turns and transcript.
  await page.getByRole("link", { name: "Conversations" }).click();
  await page.getByTestId("conversation-row").first().waitFor({ timeout: 30_000 });
  // A conversation past its first turn (its follow-ups show the cache at work).
  const later = page.getByTestId("conversation-row").filter({ hasText: /[2-9] \/ [2-9]/ }).first();
  await until("a conversation past its first turn", 90, async () => (await later.count()) > 0);
  await page.screenshot({ path: resolve(shots, "conversations.png"), fullPage: true });
  await later.getByRole("link").first().click();
  await until("two turns", 30, async () => (await page.getByTestId("turn-row").count()) >= 2);
  await page.getByText("Transcript").waitFor();
  // Why turn 2 went where it did: every worker's terms, the serving worker chosen.
  const turn2 = page.getByTestId("turn-row").nth(1);
  await until("turn 2 answered", 60, async () => (await turn2.getByTestId("why").count()) > 0);
  await turn2.getByTestId("why").click();
  const route = page.getByTestId("route");
  await route.waitFor();
  const workersRows = route.getByTestId("route-worker");
  if ((await workersRows.count()) !== 3) fail(`the explanation lists ${await workersRows.count()} workers, not 3`);
  const chosen = (await workersRows.first().locator("td").first().textContent()).trim();
  const served = (await turn2.locator("td").nth(8).textContent()).trim();
  if ((await workersRows.first().getAttribute("class")) !== "chosen" || chosen !== served)
    fail(`the explanation chose ${chosen}, the turn was served by ${served}`);
  await page.screenshot({ path: resolve(shots, "conversation.png"), fullPage: true });

  // The diagrams reflect the running fleet.
  await page.getByRole("link", { name: "Architecture" }).click();
  await until("both fleets' workers in the diagram", 20, async () => (await page.getByTestId("diagram-worker").count()) === 6);
  await page.screenshot({ path: resolve(shots, "architecture.png"), fullPage: true });
  await page.getByRole("link", { name: "How KV routing works" }).click();
  await page.getByText("equal hashes mean equal prefixes", { exact: false }).waitFor();
  await until("the fleet's workers in the diagram", 20, async () => (await page.getByTestId("how-worker").count()) === 3);
  await page.getByText(/chosen by/).waitFor({ timeout: 45_000 });
  await page.screenshot({ path: resolve(shots, "how-it-works.png"), fullPage: true });

  // Stop: the load ends, Start comes back, the cards and the live table are cleared.
  await stop.click();
  await until("Start enabled again", 30, () => start.isEnabled());
  const s = await status(base);
  if (s.running) fail("still running after Stop");
  await page.getByRole("link", { name: "Dashboard" }).click();
  await until("the cards cleared", 10, async () => {
    const rps = await page.getByTestId("kpi-RPS").locator(".kpi-value").textContent();
    const ttft = await page.getByTestId("live-TTFT-p95").textContent();
    return rps === "—" && ttft === "—";
  });
  const completed = s.arms.map((a) => `${a.name} ${a.totals.completed}`).join(", ");

  // The demo ends: the page says so in words.
  demo.kill("SIGINT");
  await page.locator(".conn-closed").waitFor({ timeout: 20_000 });
  await page.getByRole("link", { name: "Conversations" }).click();
  await page.getByText(/does not answer/).waitFor({ timeout: 20_000 });
  if ((await page.locator("body").textContent()).includes("TypeError")) fail("the page shows a raw TypeError");
  await page.screenshot({ path: resolve(shots, "offline.png"), fullPage: true });
  console.log(`e2e ok: turns completed ${completed}, screenshots in ${shots}`);
} finally {
  await browser?.close();
  demo.kill("SIGINT");
}
