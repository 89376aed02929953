// What the end-to-end tests share: the kvroute binary, starting `kvroute demo` and reading
// its dashboard URL, the load generator's status, waiting for a condition, and headless
// Chromium.
//
//   KVROUTE_BIN   the kvroute binary (default: ../target/release/kvroute, else ../target/debug/kvroute)
//   CHROMIUM      the browser (default: /usr/bin/chromium)
import { spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
export const root = resolve(here, "..", "..");
export const shots = resolve(root, "docs", "screenshots");
const bin =
  process.env.KVROUTE_BIN ??
  [resolve(root, "target/release/kvroute"), resolve(root, "target/debug/kvroute")].find(existsSync);
if (!bin) throw new Error("no kvroute binary: build it (cargo build -p kvroute) or set KVROUTE_BIN");
mkdirSync(shots, { recursive: true });

export const deadline = (secs) => Date.now() + secs * 1000;
export const fail = (msg) => {
  throw new Error(msg);
};

/** Starts `kvroute demo ARGS` (gateway and dashboard on free ports): the process and a
 * promise of its dashboard URL. */
export function startDemo(args) {
  const demo = spawn(bin, ["demo", "--port", "0", "--ui-port", "0", ...args], {
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, RUST_LOG: "warn" },
  });
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

/** The load generator's `/api/status`. */
export async function status(base) {
  const r = await fetch(`${base}/api/status`);
  return r.json();
}

/** Waits until `f()` is true, checking every 250 ms; fails after `secs`. */
export async function until(what, secs, f) {
  const end = deadline(secs);
  for (;;) {
    if (await f()) return;
    if (Date.now() > end) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** Headless Chromium. */
export function launchBrowser() {
  return chromium.launch({
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
}
