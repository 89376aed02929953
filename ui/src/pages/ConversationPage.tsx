// One conversation: per-turn figures and the transcript; refreshed every 3 s while active.
import { Link, useParams } from "react-router-dom";
import { usePoll } from "../api";
import { clock, duration, ms, num } from "../format";
import type { ConversationDetail } from "../types";
import { StatusBadge } from "./Conversations";

export function ConversationPage() {
  const { id } = useParams();
  const path = id ? `/api/conversations/${encodeURIComponent(id)}` : null;
  // Poll every 3 s; an ended conversation no longer changes, but polling it is cheap.
  const { data: c, error } = usePoll<ConversationDetail>(path, 3000);
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
          </tr>
        </thead>
        <tbody>
          {c.turns.map((t) => {
            // Token counts arrive with the answer.
            const tokens = (v: number | null) => (t.status === "in_flight" ? "—" : num(v));
            return (
            <tr key={t.turn} data-testid="turn-row">
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
              <td>{t.worker ?? "—"}</td>
            </tr>
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
                <span className="role">assistant{t.worker ? ` · ${t.worker}` : ""}</span>
                <p>{t.assistant}</p>
              </div>
            )}
          </div>
        ))}
      </div>
    </section>
  );
}
