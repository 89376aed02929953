// How KV-aware routing works, drawn from the running system: the latest follow-up turn's
// prompt as blocks, how many of them the router expected cached and the engine found cached
// on the worker that served it, and every worker of the fleet with its policy.
import { usePoll } from "../api";
import { num } from "../format";
import type { ConversationDetail, ConversationsAnswer, FleetsAnswer, TurnView } from "../types";

/** Blocks drawn for a prompt (each stands for an equal share of its tokens). */
const CELLS = 16;

function latestFollowUp(detail: ConversationDetail | null): TurnView | undefined {
  return detail?.turns
    .slice()
    .reverse()
    .find((t) => t.turn > 1 && t.status === "completed");
}

export function PromptBlocks(props: { turn: TurnView | undefined; workers: string[]; policy: string | null }) {
  const t = props.turn;
  const cell = 44;
  const x0 = 150;
  const rows = props.workers.length > 0 ? props.workers : ["worker"];
  const h = 90 + rows.length * 46;
  const share = (tokens: number | null | undefined) =>
    t && t.input_tokens > 0 && tokens ? Math.round((tokens / t.input_tokens) * CELLS) : 0;
  const cached = share(t?.cached_tokens);
  const predicted = share(t?.predicted_cached_tokens ?? 0);
  return (
    <svg viewBox={`0 0 900 ${h}`} className="diagram" role="img" aria-label="prefix matching on the running fleet">
      <text x="10" y="30" className="box-title">
        {t ? `turn ${t.turn} prompt` : "a follow-up"}
      </text>
      {Array.from({ length: CELLS }, (_, i) => (
        <rect key={i} x={x0 + i * cell} y="12" width={cell - 4} height="28" rx="4" className={i < cached ? "block hit" : "block miss"} />
      ))}
      <text x={x0} y="58" className="box-text">
        {t
          ? `${num(t.input_tokens)} prompt tokens: ${num(t.cached_tokens)} found cached by the engine (green), ${num(
              t.predicted_cached_tokens,
            )} predicted by the router (line)`
          : "waiting for a completed follow-up turn: press Start"}
      </text>
      {t && predicted > 0 && <line x1={x0} x2={x0 + predicted * cell - 4} y1="44" y2="44" className="flow" />}
      {rows.map((w, i) => {
        const y = 80 + i * 46;
        const chosen = t?.worker === w;
        return (
          <g key={w} data-testid="how-worker">
            <text x="10" y={y + 20} className="box-title">
              {w}
            </text>
            <rect x={x0} y={y} width={CELLS * cell - 4} height="30" rx="6" className={`box${chosen ? " gateway" : ""}`} />
            <text x={x0 + 10} y={y + 20} className="box-text">
              {chosen
                ? `chosen by ${props.policy ?? "the policy"}: holds the conversation's history, only ${num(
                    (t?.input_tokens ?? 0) - (t?.cached_tokens ?? 0),
                  )} new tokens to prefill`
                : "would have to prefill the whole history (or wait behind its load)"}
            </text>
          </g>
        );
      })}
    </svg>
  );
}

export function HowItWorks() {
  const { data: fleets } = usePoll<FleetsAnswer>("/api/fleet", 5000);
  // The candidate arm's fleet (the policy on show), whose conversations the list serves.
  const fleet = (fleets?.arms.find((a) => !a.baseline) ?? fleets?.arms[0])?.fleet ?? null;
  // The newest conversation with a completed follow-up turn (the server filters: under load
  // the newest conversations are all on their first turn).
  const { data: list } = usePoll<ConversationsAnswer>("/api/conversations?limit=1&followup=1", 5000);
  const candidate = list?.conversations[0];
  const { data: detail } = usePoll<ConversationDetail>(candidate ? `/api/conversations/${candidate.id}` : null, 5000);
  return (
    <section>
      <h2>How KV routing works</h2>
      <ol className="steps">
        <li>
          The prompt (chat template applied) is tokenized and cut into fixed-size blocks; each block's hash chains the one
          before it, so equal hashes mean equal prefixes.
        </li>
        <li>The index, fed by the workers' KV events, tells for each worker how many leading blocks it already holds.</li>
        <li>
          Cached blocks skip prefill: the policy weighs the uncached tokens against each worker's queued work and picks the
          soonest first token.
        </li>
        <li>
          When the answer ends, the next turn resends the history: it finds it cached on the same worker, and only the new
          blocks are computed.
        </li>
      </ol>
      <h3>On this fleet, now</h3>
      <PromptBlocks
        turn={latestFollowUp(detail)}
        workers={fleet?.workers.map((w) => w.name) ?? []}
        policy={fleet?.policy ?? null}
      />
    </section>
  );
}
