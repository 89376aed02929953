import { describe, expect, it, vi } from "vitest";
import { debounce } from "../debounce";
import { DASH, duration, improvement, ms, nearest, num, pct, sloClass } from "../format";

describe("formatting", () => {
  it("shows a dash without data", () => {
    for (const f of [ms(null), num(undefined), pct(null), improvement(null, 3), duration(undefined)]) {
      expect(f).toBe(DASH);
    }
    expect(ms(Number.NaN)).toBe(DASH);
  });
  it("formats latencies by size and failures as infinite", () => {
    expect(ms(12.345)).toBe("12.3 ms");
    expect(ms(655.4)).toBe("655 ms");
    expect(ms(31_430)).toBe("31.4 s");
    expect(ms("inf")).toBe("∞");
  });
  it("formats counts, ratios and durations", () => {
    expect(num(3168.4)).toBe("3,168");
    expect(num(2.345, 2)).toBe("2.35");
    expect(pct(0.6824)).toBe("68.2%");
    expect(duration(185_000)).toBe("3m 05s");
  });
  it("gives the improvement of a lower latency as positive", () => {
    expect(improvement(446, 655)).toBe("+31.9%");
    expect(improvement(700, 655)).toBe("-6.9%");
    expect(improvement(1, 0)).toBe(DASH);
  });
});

describe("SLO colouring", () => {
  it("is red above the limit, yellow within 90%, green below", () => {
    expect(sloClass(601, 600)).toBe("bad");
    expect(sloClass(600, 600)).toBe("warn");
    expect(sloClass(540, 600)).toBe("warn");
    expect(sloClass(539.9, 600)).toBe("ok");
    expect(sloClass(null, 600)).toBe("none");
    expect(sloClass(10, null)).toBe("none");
  });
});

describe("baseline lookup", () => {
  it("takes the exact level, else the nearest", () => {
    const pts = [{ concurrency: 60 }, { concurrency: 80 }, { concurrency: 100 }];
    expect(nearest(pts, 80)?.concurrency).toBe(80);
    expect(nearest(pts, 92)?.concurrency).toBe(100);
    expect(nearest(pts, 10)?.concurrency).toBe(60);
    expect(nearest([], 10)).toBeUndefined();
  });
});

describe("debounce", () => {
  it("runs only the last of quick calls, after the quiet time", () => {
    vi.useFakeTimers();
    const seen: number[] = [];
    const d = debounce((n: number) => seen.push(n), 300);
    d(80);
    vi.advanceTimersByTime(200);
    d(100);
    vi.advanceTimersByTime(299);
    expect(seen).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(seen).toEqual([100]);
    d(120);
    d.cancel();
    vi.advanceTimersByTime(1000);
    expect(seen).toEqual([100]);
    vi.useRealTimers();
  });
});
