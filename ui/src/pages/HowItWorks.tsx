// How KV-aware routing works, as a diagram: a follow-up turn's blocks matched against what
// each worker caches, and the choice weighed against load.
const BLOCKS = ["system", "doc 1", "doc 2", "doc 3", "turn 1", "answer 1", "turn 2"];

export function HowItWorks() {
  const cached = [6, 2, 0];
  const load = [3, 1, 1];
  const cell = 70;
  return (
    <section>
      <h2>How KV routing works</h2>
      <ol className="steps">
        <li>The prompt (chat template applied) is tokenized and cut into fixed-size blocks; each block's hash chains the one before it, so equal hashes mean equal prefixes.</li>
        <li>The index, fed by the workers' KV events, tells for each worker how many leading blocks it already holds.</li>
        <li>Cached blocks skip prefill: the policy weighs the uncached tokens against each worker's queued work and picks the soonest first token.</li>
        <li>When the answer ends, the next turn resends the history: it finds it cached on the same worker, and only the new blocks are computed.</li>
      </ol>
      <svg viewBox="0 0 900 300" className="diagram" role="img" aria-label="prefix matching across workers">
        <text x="10" y="28" className="box-title">
          turn 2 prompt
        </text>
        {BLOCKS.map((b, i) => (
          <g key={b}>
            <rect x={130 + i * cell} y="8" width={cell - 6} height="30" rx="4" className="block" />
            <text x={130 + i * cell + (cell - 6) / 2} y="28" textAnchor="middle" className="box-text">
              {b}
            </text>
          </g>
        ))}
        {cached.map((c, w) => (
          <g key={w}>
            <text x="10" y={88 + w * 70} className="box-title">
              worker {w}
            </text>
            {BLOCKS.map((_, i) => (
              <rect
                key={i}
                x={130 + i * cell}
                y={68 + w * 70}
                width={cell - 6}
                height="30"
                rx="4"
                className={i < c ? "block hit" : "block miss"}
              />
            ))}
            <text x={130 + BLOCKS.length * cell + 10} y={82 + w * 70} className="box-text">
              {c} of {BLOCKS.length} blocks cached
            </text>
            <text x={130 + BLOCKS.length * cell + 10} y={100 + w * 70} className="box-text">
              {load[w]} requests queued{w === 0 ? " → chosen: least work to first token" : ""}
            </text>
          </g>
        ))}
        <text x="10" y="290" className="box-text">
          green: prefix already in the worker's KV cache (no prefill) · grey: must be computed
        </text>
      </svg>
    </section>
  );
}
