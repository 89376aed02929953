import { afterEach, describe, expect, it, vi } from "vitest";
import { ADMIN_KEY, control } from "../api";

function answer(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

describe("control calls", () => {
  afterEach(() => {
    vi.unstubAllGlobals();
    sessionStorage.clear();
  });

  it("asks for the admin key once on 401 and retries with it", async () => {
    const calls: RequestInit[] = [];
    vi.stubGlobal(
      "fetch",
      vi.fn(async (_path: string, init: RequestInit) => {
        calls.push(init);
        const auth = (init.headers as Record<string, string>)["authorization"];
        return auth === "Bearer root"
          ? answer(202, {})
          : answer(401, { error: { message: "the admin key is needed", code: "invalid_admin_key" } });
      }),
    );
    const ask = vi.fn(() => "root");
    expect(await control("/api/concurrency", { concurrency: 3 }, ask)).toBeNull();
    expect(ask).toHaveBeenCalledTimes(1);
    expect(calls).toHaveLength(2);
    expect(sessionStorage.getItem(ADMIN_KEY)).toBe("root");
    // The next call sends the stored key at once.
    expect(await control("/api/stop", undefined, ask)).toBeNull();
    expect(ask).toHaveBeenCalledTimes(1);
  });

  it("gives the server's message when no key is entered or it is wrong", async () => {
    vi.stubGlobal(
      "fetch",
      vi.fn(async () => answer(401, { error: { message: "the admin key is needed", code: "invalid_admin_key" } })),
    );
    expect(await control("/api/start", undefined, () => null)).toBe("the admin key is needed");
    expect(await control("/api/start", undefined, () => "wrong")).toBe("the admin key is needed");
  });
});
