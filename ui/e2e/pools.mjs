// End-to-end test of the dashboard with a gateway serving two models (`kvroute demo --pools
// 2`): the model picker lists both, the first model's workers are shown; picking the second
// shows its pool's workers (`m2-worker-*`), Start sends the load to it (its workers' engines
// name it), the picker is locked while the load runs; a screenshot into docs/screenshots/.
//
// KVROUTE_BIN and CHROMIUM as in demo.mjs.
import { resolve } from "node:path";
import { fail, launchBrowser, shots, startDemo, status, until } from "./demo.mjs";

const { demo, url } = startDemo([
  "--pools", "2", "--workers", "2", "--baseline-policy", "none",
  "--slider-min", "4", "--slider-max", "8", "--slider-step", "4",
]);
let browser;
try {
  const base = await url;
  browser = await launchBrowser();
  const page = await browser.newPage({ viewport: { width: 1360, height: 1200 } });
  page.on("pageerror", (e) => fail(`page error: ${e}`));
  await page.goto(`${base}/`);
  await page.locator(".conn-open").waitFor({ timeout: 20_000 });

  // Both models offered; the first one's workers shown.
  const select = page.getByTestId("model-select");
  await select.waitFor({ timeout: 30_000 });
  const options = await select.locator("option").allTextContents();
  if (options.join() !== "kvroute-sim,kvroute-sim-2") fail(`the picker offers ${options}`);
  const cardNames = async () => (await page.getByTestId("worker-card").allTextContents()).map((t) => t.slice(0, 40));
  await until("the first model's workers", 30, async () => {
    const cards = await cardNames();
    return cards.length === 2 && cards.every((c) => c.startsWith("worker-"));
  });

  // The second model: its pool's workers.
  await select.selectOption("kvroute-sim-2");
  await until("the load's model", 10, async () => (await status(base)).model === "kvroute-sim-2");
  await until("the second model's workers", 30, async () => {
    const cards = await cardNames();
    return cards.length === 2 && cards.every((c) => c.startsWith("m2-worker-"));
  });

  // Start: the load asks for it; the picker is locked while it runs.
  const start = page.getByRole("button", { name: "Start" });
  const stop = page.getByRole("button", { name: "Stop" });
  await start.click();
  await until("Stop enabled", 20, () => stop.isEnabled());
  if (!(await select.isDisabled())) fail("the model picker is not locked while the load runs");
  await until("the KPIs to fill", 120, async () => {
    const rps = await page.getByTestId("kpi-RPS").locator(".kpi-value").textContent();
    return rps !== "—";
  });
  await until("the workers' engines to name the model", 30, async () => {
    const engines = await page.getByTestId("worker-engine").allTextContents();
    return engines.length === 2 && engines.every((e) => /· kvroute-sim-2$/.test(e.trim()));
  });
  const text = await (await fetch(`${(await status(base)).arms[0].target}/metrics`)).text();
  const served = (model) =>
    Number(text.match(new RegExp(`kvroute_requests_total\\{model="${model}",status="200"\\} (\\d+)`))?.[1] ?? 0);
  if (!(served("kvroute-sim-2") > 0) || served("kvroute-sim") !== 0)
    fail(`requests by model: kvroute-sim ${served("kvroute-sim")}, kvroute-sim-2 ${served("kvroute-sim-2")}`);
  await page.screenshot({ path: resolve(shots, "dashboard-models.png"), fullPage: true });

  await stop.click();
  await until("Start enabled again", 30, () => start.isEnabled());
  await until("the picker unlocked", 10, () => select.isEnabled());
  console.log(`e2e (two models) ok: kvroute-sim-2 served ${served("kvroute-sim-2")} requests`);
} finally {
  await browser?.close();
  demo.kill("SIGINT");
}
