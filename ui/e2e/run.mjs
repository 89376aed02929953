// End-to-end test of the dashboard in headless Chromium: starts `kvroute demo`, opens the
// UI, presses Start, waits for the KPIs to fill, moves the slider and sees the load change,
// sees each worker's prediction accuracy, opens a conversation and the routing explanation
// of its second turn, stops, and saves a screenshot of every page into docs/screenshots/.
//
//   KVROUTE_BIN   the kvroute binary (default: ../target/release/kvroute, else ../target/debug/kvroute)
//   CHROMIUM      the browser (default: /usr/bin/chromium)
import { spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const shots = resolve(root, "docs", "screenshots");
const bin =
  process.env.KVROUTE_BIN ??
  [resolve(root, "target/release/kvroute"), resolve(root, "target/debug/kvroute")].find(existsSync);
if (!bin) throw new Error("no kvroute binary: build it (cargo build -p kvroute) or set KVROUTE_BIN");
mkdirSync(shots, { recursive: true });

const deadline = (secs) => Date.now() + secs * 1000;
const fail = (msg) => {
  throw new Error(msg);
};

/** Starts the demo and resolves to its dashboard URL. */
function startDemo() {
  const demo = spawn(
    bin,
    ["demo", "--port", "0", "--ui-port", "0", "--baseline", resolve(root, "deploy/baselines/demo-round_robin-w3.json")],
    { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, RUST_LOG: "warn" } },
  );
  const url = new Promise((ok, ko) => {
    let out = "";
    const timer = setTimeout(() => ko(new Error(`the demo printed no dashboard URL:\n${out}`)), 60_000);
    demo.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/dashboard (http:\/\/[^\s/]+)\//);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    demo.on("exit", (code) => ko(new Error(`the demo exited (${code}):\n${out}`)));
  });
  return { demo, url };
}

async function status(base) {
  const r = await fetch(`${base}/api/status`);
  return r.json();
}

async function until(what, secs, f) {
  const end = deadline(secs);
  for (;;) {
    if (await f()) return;
    if (Date.now() > end) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

const { demo, url } = startDemo();
let browser;
try {
  const base = await url;
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
      "--disable-sync",
    ],
  });
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

  // The slider: the load generator runs at the new level.
  await page.getByRole("slider").fill("80");
  await until("concurrency 80", 20, async () => (await status(base)).concurrency === 80);
  await until("80 conversations", 60, async () => (await status(base)).active_conversations >= 70);
  await until("the workers' cards", 20, async () => (await page.getByTestId("worker-card").count()) === 3);
  // Each card: the gateway's trust in its index and how exactly it predicted the cache.
  await until("every worker's prediction accuracy", 30, async () => {
    const cells = await page.getByTestId("prediction-accuracy").allTextContents();
    return cells.length === 3 && cells.every((c) => /% of \d/.test(c));
  });
  for (const state of await page.getByTestId("cache-state").allTextContents()) {
    if (state !== "exact") fail(`a worker's index is ${state}, not exact`);
  }
  // For the documentation's pictures, let the load settle (KVROUTE_E2E_SETTLE_SECS).
  const settle = Number(process.env.KVROUTE_E2E_SETTLE_SECS ?? "3");
  await page.waitForTimeout(settle * 1000);
  await page.screenshot({ path: resolve(shots, "dashboard.png"), fullPage: true });

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
  const rows = route.getByTestId("route-worker");
  if ((await rows.count()) !== 3) fail(`the explanation lists ${await rows.count()} workers, not 3`);
  const chosen = (await rows.first().locator("td").first().textContent()).trim();
  const served = (await turn2.locator("td").nth(8).textContent()).trim();
  if ((await rows.first().getAttribute("class")) !== "chosen" || chosen !== served)
    fail(`the explanation chose ${chosen}, the turn was served by ${served}`);
  await page.screenshot({ path: resolve(shots, "conversation.png"), fullPage: true });

  // The diagrams reflect the running fleet.
  await page.getByRole("link", { name: "Architecture" }).click();
  await until("three workers in the diagram", 20, async () => (await page.getByTestId("diagram-worker").count()) === 3);
  await page.screenshot({ path: resolve(shots, "architecture.png"), fullPage: true });
  await page.getByRole("link", { name: "How KV routing works" }).click();
  await page.getByText("equal hashes mean equal prefixes", { exact: false }).waitFor();
  await until("the fleet's workers in the diagram", 20, async () => (await page.getByTestId("how-worker").count()) === 3);
  await page.getByText(/chosen by/).waitFor({ timeout: 45_000 });
  await page.screenshot({ path: resolve(shots, "how-it-works.png"), fullPage: true });

  // Stop: the load ends, Start comes back.
  await stop.click();
  await until("Start enabled again", 30, () => start.isEnabled());
  const s = await status(base);
  if (s.running) fail("still running after Stop");
  console.log(`e2e ok: ${s.totals.completed} turns completed, screenshots in ${shots}`);
} finally {
  await browser?.close();
  demo.kill("SIGINT");
}
