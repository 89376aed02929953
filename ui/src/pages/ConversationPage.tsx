// One conversation: per-turn figures, why the gateway routed each turn where it did, and
// the transcript; refreshed every 3 s while active.
import { Fragment, useState } from "react";
import { Link, useParams } from "react-router-dom";
import { usePoll } from "../api";
import { clock, duration, ms, num } from "../format";
import type { ConversationDetail, RouteExplanation } from "../types";
import { StatusBadge } from "./Conversations";

/** The blocks a worker would load back from host memory or disk, when there are any. */
function offloaded(host = 0, disk = 0): string {
  const parts = [host > 0 ? `${num(host)} from host` : "", disk > 0 ? `${num(disk)} from disk` : ""];
  const text = parts.filter((p) => p !== "").join(", ");
  return text === "" ? "" : ` + ${text}`;
}

/** The routing decision of one turn: every worker's terms, the chosen one first. */
export function RouteTable(props: { route: RouteExplanation; cached: number | null }) {
  const r = props.route;
  return (
    <div className="route" data-testid="route">
      <p className="muted">
        {r.policy} policy, {num(r.prompt_tokens)} prompt tokens in blocks of {r.block_size}: of
        the workers offered (not busy), the lowest cost wins.
        {props.cached !== null ? ` The engine reported ${num(props.cached)} cached tokens.` : ""}
      </p>
      <table>
        <thead>
          <tr>
            <th>worker</th>
            <th>cached prefix (predicted)</th>
            <th>tokens to compute</th>
            <th>in flight</th>
            <th>prefill queued</th>
            <th>cost</th>
            <th></th>
          </tr>
        </thead>
        <tbody>
          {r.workers.map((w) => (
            <tr key={w.name} className={w.chosen ? "chosen" : ""} data-testid="route-worker">
              <td>{w.name}</td>
              <td>
                {num(w.matched_blocks)} blocks · {num(w.matched_blocks * r.block_size)} tok
                {offloaded(w.host_blocks, w.disk_blocks)}
              </td>
              <td>{num(w.uncached_tokens)}</td>
              <td>{num(w.inflight)}</td>
              <td>{num(w.prefill_tokens)} tok</td>
              <td>{w.cost === null ? "—" : num(w.cost, 2)}</td>
              <td>{w.chosen ? "chosen" : w.busy ? "busy" : w.eligible ? "" : "not eligible"}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {r.omitted > 0 && <p className="muted">{r.omitted} more workers not shown.</p>}
    </div>
  );
}

/** The worker that decoded a turn and, when another computed its prompt (disaggregated
 * prefill), that one. */
export function TurnWorkers(props: { worker: string | null; prefill: string | null }) {
  return (
    <>
      {props.worker ?? "—"}
      {props.prefill && <span className="muted"> (prefilled on {props.prefill})</span>}
    </>
  );
}

export function ConversationPage() {
  const { id } = useParams();
  const path = id ? `/api/conversations/${encodeURIComponent(id)}` : null;
  // Poll every 3 s; an ended conversation no longer changes, but polling it is cheap.
  const { data: c, error } = usePoll<ConversationDetail>(path, 3000);
  const [open, setOpen] = useState<number | null>(null);
  if (error) {
    return (
      <section>
        <p className="error">{error}</p>
        <Link to="/conversations">All conversations</Link>
      </section>
    );
  }
  if (!c) return <p className="muted">Loading…</p>;
  return (
    <section className="conversation">
      <p>
        <Link to="/conversations">← All conversations</Link>
      </p>
      <h2>
        Conversation {c.id} <StatusBadge status={c.status} />
      </h2>
      <p className="muted">
        {c.topic} — {c.turns.length} of {c.planned_turns} turns, {duration(c.duration_ms)}, started {clock(c.started_unix_ms)}
        {c.error ? ` — ${c.error}` : ""}
      </p>
      <table className="turns">
        <thead>
          <tr>
            <th>turn</th>
            <th>status</th>
            <th>TTFT</th>
            <th>ITL</th>
            <th>latency</th>
            <th>prompt tokens</th>
            <th>cached (predicted / actual)</th>
            <th>output tokens</th>
            <th>worker</th>
            <th>routing</th>
          </tr>
        </thead>
        <tbody>
          {c.turns.map((t) => {
            // Token counts arrive with the answer.
            const tokens = (v: number | null) => (t.status === "in_flight" ? "—" : num(v));
            return (
            <Fragment key={t.turn}>
            <tr data-testid="turn-row">
              <td>{t.turn}</td>
              <td>
                <StatusBadge status={t.status} />
                {t.error ? ` ${t.error}` : ""}
              </td>
              <td>{ms(t.ttft_ms)}</td>
              <td>{ms(t.itl_ms)}</td>
              <td>{ms(t.latency_ms)}</td>
              <td>{tokens(t.input_tokens)}</td>
              <td>
                {tokens(t.predicted_cached_tokens)} / {tokens(t.cached_tokens)}
              </td>
              <td>{tokens(t.output_tokens)}</td>
              <td data-testid="turn-worker">
                <TurnWorkers worker={t.worker} prefill={t.prefill_worker} />
              </td>
              <td>
                {t.route ? (
                  <button
                    className="link"
                    data-testid="why"
                    onClick={() => setOpen(open === t.turn ? null : t.turn)}
                  >
                    {open === t.turn ? "hide" : "why?"}
                  </button>
                ) : (
                  "—"
                )}
              </td>
            </tr>
            {open === t.turn && t.route && (
              <tr>
                <td colSpan={10}>
                  <RouteTable route={t.route} cached={t.status === "in_flight" ? null : t.cached_tokens} />
                </td>
              </tr>
            )}
            </Fragment>
            );
          })}
        </tbody>
      </table>
      <h3>Transcript</h3>
      <div className="transcript">
        {c.turns.map((t) => (
          <div key={t.turn}>
            <div className="msg user">
              <span className="role">user · turn {t.turn}</span>
              <p>{t.user}</p>
            </div>
            {t.assistant && (
              <div className="msg assistant">
                <span className="role">
                  assistant{t.worker ? ` · ${t.worker}` : ""}
                  {t.prefill_worker ? ` (prefilled on ${t.prefill_worker})` : ""}
                </span>
                <p>{t.assistant}</p>
              </div>
            )}
          </div>
        ))}
      </div>
    </section>
  );
}
