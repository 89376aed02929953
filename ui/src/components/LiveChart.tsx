// A small line chart of live figures (one line per arm) against their objective, as SVG;
// the axis labels are measured so they always fit inside the drawing.
import { isNum } from "../format";

export interface Point {
  t: number;
  v: number | null;
}

export interface Series {
  name: string;
  points: Point[];
  /** CSS class of the line (`series`, `series-baseline`). */
  className: string;
}

/** A compact axis label: 950, 1.2k, 17.6k. */
export function tickLabel(v: number): string {
  if (v >= 10_000) return `${(v / 1000).toFixed(0)}k`;
  if (v >= 1_000) return `${(v / 1000).toFixed(1)}k`;
  return `${Math.round(v)}`;
}

/** Left padding that holds `label` at the chart's font size (about 7 px a character). */
export function labelPad(label: string): number {
  return 10 + label.length * 7;
}

export function LiveChart(props: { title: string; series: Series[]; limit: number | null; unit: string }) {
  const { series, limit } = props;
  const w = 460;
  const h = 150;
  const all = series.flatMap((s) => s.points);
  const values = all.map((p) => p.v).filter(isNum);
  const top = Math.max(1, ...values, isNum(limit) ? limit * 1.2 : 0);
  const topLabel = tickLabel(top);
  const pad = Math.max(30, labelPad(topLabel));
  const bottom = 30;
  const times = all.map((p) => p.t);
  const t0 = times.length ? Math.min(...times) : 0;
  const t1 = times.length ? Math.max(...times) : 1;
  const x = (t: number) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (w - pad - 8);
  const y = (v: number) => h - bottom + 8 - (v / top) * (h - bottom - 8);
  const pathOf = (points: Point[]) => {
    let path = "";
    let pen = false;
    for (const p of points) {
      if (!isNum(p.v)) {
        pen = false;
        continue;
      }
      path += `${pen ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)} `;
      pen = true;
    }
    return path;
  };
  return (
    <figure className="chart">
      <figcaption>
        {props.title}
        {series.length > 1 &&
          series.map((s) => (
            <span key={s.name} className={`legend ${s.className}`}>
              {s.name}
            </span>
          ))}
      </figcaption>
      <svg viewBox={`0 0 ${w} ${h}`} role="img" aria-label={props.title}>
        <line x1={pad} y1={h - bottom + 8} x2={w - 8} y2={h - bottom + 8} className="axis" />
        <line x1={pad} y1={8} x2={pad} y2={h - bottom + 8} className="axis" />
        <text x={pad - 4} y={14} className="tick" textAnchor="end" data-testid="y-top">
          {topLabel}
        </text>
        <text x={pad - 4} y={h - bottom + 8} className="tick" textAnchor="end">
          0
        </text>
        <text x={w - 8} y={h - 6} className="tick" textAnchor="end">
          last {Math.round((t1 - t0) / 1000)} s ({props.unit})
        </text>
        {isNum(limit) && (
          <>
            <line x1={pad} x2={w - 8} y1={y(limit)} y2={y(limit)} className="slo-line" />
            <text x={w - 10} y={y(limit) - 4} className="tick slo-text" textAnchor="end">
              SLO {limit}
            </text>
          </>
        )}
        {series.map((s) => (
          <path key={s.name} d={pathOf(s.points)} className={s.className} data-testid={`line-${s.name}`} />
        ))}
      </svg>
    </figure>
  );
}
