// Talking to the load generator: the WebSocket of live statistics (reconnecting), polled
// JSON endpoints, and the control calls.
import { useEffect, useRef, useState } from "react";
import type { LiveStats } from "./types";

export type Connection = "connecting" | "open" | "closed";

/** The live statistics from `/api/ws`, and the connection's state. */
export function useLiveStats(): { stats: LiveStats | null; connection: Connection } {
  const [stats, setStats] = useState<LiveStats | null>(null);
  const [connection, setConnection] = useState<Connection>("connecting");
  useEffect(() => {
    let socket: WebSocket | null = null;
    let retry: ReturnType<typeof setTimeout> | undefined;
    let closed = false;
    const connect = () => {
      const proto = window.location.protocol === "https:" ? "wss:" : "ws:";
      socket = new WebSocket(`${proto}//${window.location.host}/api/ws`);
      setConnection("connecting");
      socket.onopen = () => setConnection("open");
      socket.onmessage = (e) => {
        try {
          setStats(JSON.parse(e.data as string) as LiveStats);
        } catch {
          // Not ours: ignore.
        }
      };
      socket.onclose = () => {
        setConnection("closed");
        if (!closed) retry = setTimeout(connect, 1000);
      };
    };
    connect();
    return () => {
      closed = true;
      if (retry !== undefined) clearTimeout(retry);
      socket?.close();
    };
  }, []);
  return { stats, connection };
}

/** What a failed call says to a person: a network failure becomes a sentence. */
export function humanError(e: unknown): string {
  if (e instanceof TypeError) {
    return "The load generator does not answer: is `kvroute demo` (or `kvroute loadgen --ui-port`) still running? The page retries on its own.";
  }
  return String(e);
}

/** GETs `path` now and every `everyMs` (0: once); `null` until the first answer. */
export function usePoll<T>(path: string | null, everyMs: number): { data: T | null; error: string | null } {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string | null>(null);
  const current = useRef(path);
  current.current = path;
  useEffect(() => {
    if (path === null) return;
    let stop = false;
    const load = async () => {
      try {
        const r = await fetch(path);
        const body = await r.json();
        if (stop || current.current !== path) return;
        if (!r.ok) {
          setError(body?.error?.message ?? `HTTP ${r.status}`);
          setData(null);
        } else {
          setError(null);
          setData(body as T);
        }
      } catch (e) {
        if (!stop) setError(humanError(e));
      }
    };
    void load();
    const t = everyMs > 0 ? setInterval(load, everyMs) : undefined;
    return () => {
      stop = true;
      if (t !== undefined) clearInterval(t);
    };
  }, [path, everyMs]);
  return { data, error };
}

/** Where the dashboard keeps the admin key the user entered (this tab only). */
export const ADMIN_KEY = "kvroute-admin-key";

/**
 * POSTs a control call; resolves to an error message or null. When the server asks for the
 * admin key (401 `invalid_admin_key`: a dashboard beyond loopback started with
 * `KVROUTE_ADMIN_KEY`), asks the user once and retries with it; the key stays in this tab.
 */
export async function control(
  path: string,
  body?: unknown,
  ask: () => string | null = () => window.prompt("Admin key of this dashboard"),
): Promise<string | null> {
  try {
    for (let attempt = 0; attempt < 2; attempt++) {
      const headers: Record<string, string> = {};
      if (body !== undefined) headers["content-type"] = "application/json";
      const key = sessionStorage.getItem(ADMIN_KEY);
      if (key) headers["authorization"] = `Bearer ${key}`;
      const r = await fetch(path, {
        method: "POST",
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (r.ok) return null;
      const j = await r.json().catch(() => null);
      if (attempt === 0 && r.status === 401 && j?.error?.code === "invalid_admin_key") {
        const entered = ask();
        if (entered) {
          sessionStorage.setItem(ADMIN_KEY, entered.trim());
          continue;
        }
      }
      return j?.error?.message ?? `HTTP ${r.status}`;
    }
    return "the admin key was not accepted";
  } catch (e) {
    return humanError(e);
  }
}
