// The conversations the load ran (newest first), refreshed every 5 s.
import { Link } from "react-router-dom";
import { usePoll } from "../api";
import { clock, duration } from "../format";
import type { ConversationsAnswer } from "../types";

export function StatusBadge(props: { status: string }) {
  return <span className={`badge badge-${props.status}`}>{props.status}</span>;
}

export function Conversations() {
  const { data, error } = usePoll<ConversationsAnswer>("/api/conversations?limit=200", 5000);
  const list = data?.conversations ?? [];
  return (
    <section>
      <h2>Conversations</h2>
      {error && <p className="error">{error}</p>}
      {list.length === 0 ? (
        <p className="muted">No conversation yet: press Start.</p>
      ) : (
        <table className="conversations">
          <thead>
            <tr>
              <th>#</th>
              <th>status</th>
              <th>topic</th>
              <th>turns</th>
              <th>duration</th>
              <th>started</th>
            </tr>
          </thead>
          <tbody>
            {list.map((c) => (
              <tr key={c.id} data-testid="conversation-row">
                <td>
                  <Link to={`/conversations/${c.id}`}>{c.id}</Link>
                </td>
                <td>
                  <StatusBadge status={c.status} />
                </td>
                <td>
                  <Link to={`/conversations/${c.id}`}>{c.topic}</Link>
                  {c.error && <span className="muted"> — {c.error}</span>}
                </td>
                <td>
                  {c.turns} / {c.planned_turns}
                </td>
                <td>{duration(c.duration_ms)}</td>
                <td>{clock(c.started_unix_ms)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
