// The running topology as a diagram: load generator -> gateway (policy) -> workers, with KV
// events flowing back to the gateway's index. Drawn from /api/fleet, so it shows the workers
// and policy actually running.
import { usePoll } from "../api";
import { num, pct } from "../format";
import type { Fleet, FleetsAnswer, LiveStats } from "../types";

export function TopologyDiagram(props: { fleet: Fleet | null; stats: LiveStats | null }) {
  const workers = props.fleet?.workers ?? [];
  const n = Math.max(1, workers.length);
  const rowH = 74;
  const h = Math.max(260, n * rowH + 40);
  const gwY = h / 2 - 60;
  return (
    <svg viewBox={`0 0 900 ${h}`} className="diagram" role="img" aria-label="kvroute topology">
      <defs>
        <marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
          <path d="M0,0 L10,5 L0,10 z" className="arrowhead" />
        </marker>
      </defs>
      <g>
        <rect x="20" y={gwY + 10} width="170" height="100" rx="10" className="box client" />
        <text x="105" y={gwY + 45} textAnchor="middle" className="box-title">
          Load generator
        </text>
        <text x="105" y={gwY + 67} textAnchor="middle" className="box-text">
          {props.stats ? `${props.stats.concurrency} conversations` : "—"}
        </text>
        <text x="105" y={gwY + 87} textAnchor="middle" className="box-text">
          {props.stats?.running ? "running" : "stopped"}
        </text>
      </g>
      <line x1="190" y1={gwY + 60} x2="318" y2={gwY + 60} className="flow" markerEnd="url(#arrow)" />
      <text x="254" y={gwY + 52} textAnchor="middle" className="box-text">
        OpenAI API
      </text>
      <g>
        <rect x="320" y={gwY} width="220" height="120" rx="10" className="box gateway" />
        <text x="430" y={gwY + 30} textAnchor="middle" className="box-title">
          kvroute gateway
        </text>
        <text x="430" y={gwY + 54} textAnchor="middle" className="box-text">
          policy: {props.fleet?.policy ?? "—"}
        </text>
        <text x="430" y={gwY + 76} textAnchor="middle" className="box-text">
          tokenize · hash blocks · prefix index
        </text>
        <text x="430" y={gwY + 98} textAnchor="middle" className="box-text">
          load ledger · admission
        </text>
      </g>
      {workers.map((w, i) => {
        const y = 20 + i * rowH + (h - 40 - n * rowH) / 2;
        return (
          <g key={w.name} data-testid="diagram-worker">
            <line x1="540" y1={gwY + 60} x2="648" y2={y + 30} className="flow" markerEnd="url(#arrow)" />
            <line x1="650" y1={y + 44} x2="542" y2={gwY + 80} className="events" markerEnd="url(#arrow)" />
            <rect x="650" y={y} width="230" height="60" rx="8" className={`box worker-box${w.up ? "" : " down"}`} />
            <text x="662" y={y + 22} className="box-title">
              {w.name}
            </text>
            <text x="662" y={y + 44} className="box-text">
              {num(w.inflight)} in flight · KV {pct(w.kv_usage, 0)} · {num(w.index_blocks)} blocks
            </text>
          </g>
        );
      })}
      {workers.length === 0 && (
        <text x="760" y={h / 2} textAnchor="middle" className="box-text">
          {props.fleet?.error ?? "workers: —"}
        </text>
      )}
      <text x="596" y={h - 8} textAnchor="middle" className="box-text events-text">
        dashed: KV cache events (block stored / removed)
      </text>
    </svg>
  );
}

export function Architecture(props: { stats: LiveStats | null }) {
  const { data } = usePoll<FleetsAnswer>("/api/fleet", 2000);
  return (
    <section>
      <h2>Architecture</h2>
      <p>
        The load generator sends multi-turn chats to the gateway's OpenAI-compatible API. The gateway turns each prompt
        into token blocks, finds which worker already caches the longest prefix (from the workers' own KV events), weighs
        that against each worker's load, and forwards the request, streaming the answer back.
        {(data?.arms.length ?? 0) > 1
          ? " The demo runs this twice, on identical fleets: the same conversations go to both, one gateway per routing policy, so the dashboard compares them live."
          : ""}
      </p>
      {(data?.arms ?? []).map((a) => (
        <div key={a.arm}>
          <h3>
            {a.arm} {a.baseline ? <span className="muted">(baseline)</span> : null}
          </h3>
          <TopologyDiagram fleet={a.fleet} stats={props.stats} />
        </div>
      ))}
      {!data && <TopologyDiagram fleet={null} stats={props.stats} />}
    </section>
  );
}
