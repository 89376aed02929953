// A small line chart of a live figure against its objective (drawn as SVG).
import { isNum } from "../format";

export interface Point {
  t: number;
  v: number | null;
}

export function LiveChart(props: { title: string; points: Point[]; limit: number | null; unit: string }) {
  const { points, limit } = props;
  const w = 460;
  const h = 150;
  const pad = 30;
  const values = points.map((p) => p.v).filter(isNum);
  const top = Math.max(1, ...values, isNum(limit) ? limit * 1.2 : 0);
  const t0 = points.length ? points[0].t : 0;
  const t1 = points.length ? points[points.length - 1].t : 1;
  const x = (t: number) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (w - pad - 8);
  const y = (v: number) => h - pad + 8 - (v / top) * (h - pad - 8);
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
  return (
    <figure className="chart">
      <figcaption>{props.title}</figcaption>
      <svg viewBox={`0 0 ${w} ${h}`} role="img" aria-label={props.title}>
        <line x1={pad} y1={h - pad + 8} x2={w - 8} y2={h - pad + 8} className="axis" />
        <line x1={pad} y1={8} x2={pad} y2={h - pad + 8} className="axis" />
        <text x={pad - 4} y={12} className="tick" textAnchor="end">
          {Math.round(top)}
        </text>
        <text x={pad - 4} y={h - pad + 8} className="tick" textAnchor="end">
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
        <path d={path} className="series" />
      </svg>
    </figure>
  );
}
