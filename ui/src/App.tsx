// The frame: header (title, navigation, Start / Stop) and the pages.
import { useState } from "react";
import { NavLink, Route, Routes } from "react-router-dom";
import { control, useLiveStats, usePoll } from "./api";
import { Architecture } from "./pages/Architecture";
import { ConversationPage } from "./pages/ConversationPage";
import { Conversations } from "./pages/Conversations";
import { Dashboard } from "./pages/Dashboard";
import { HowItWorks } from "./pages/HowItWorks";
import type { ConfigAnswer } from "./types";

export function App() {
  const { stats, connection } = useLiveStats();
  const { data: config } = usePoll<ConfigAnswer>("/api/config", 0);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const online = connection === "open";
  const running = stats?.running ?? false;
  const act = async (path: string) => {
    setBusy(true);
    setError(await control(path));
    setBusy(false);
  };
  return (
    <div className="app">
      <header>
        <div className="titles">
          <h1>Serve More Users on the Same GPUs with KV-Aware Routing</h1>
          <p className="subtitle">
            kvroute sends every request to the replica that already holds its prompt's KV cache — live
            multi-turn chat load
            {(config?.arms.length ?? 0) > 1
              ? `, the same conversations on ${config?.arms.length} identical fleets: ${config?.arms.map((a) => a.name).join(" vs ")}`
              : ` against ${config?.arms[0]?.target ?? "the gateway"}`}
          </p>
        </div>
        <div className="controls">
          <span className={`conn conn-${connection}`} title="connection to the load generator">
            {online ? "live" : connection === "connecting" ? "connecting…" : "offline"}
          </span>
          <button
            className="start"
            disabled={!online || running || busy || (stats?.stopping ?? false)}
            onClick={() => act("/api/start")}
          >
            Start
          </button>
          <button className="stop" disabled={!online || !running || busy} onClick={() => act("/api/stop")}>
            Stop
          </button>
        </div>
      </header>
      <nav>
        <NavLink to="/" end>
          Dashboard
        </NavLink>
        <NavLink to="/conversations">Conversations</NavLink>
        <NavLink to="/architecture">Architecture</NavLink>
        <NavLink to="/how-it-works">How KV routing works</NavLink>
      </nav>
      {error && (
        <div className="error" role="alert">
          {error}
        </div>
      )}
      <main>
        <Routes>
          <Route path="/" element={<Dashboard stats={stats} config={config?.dashboard ?? null} />} />
          <Route path="/conversations" element={<Conversations />} />
          <Route path="/conversations/:id" element={<ConversationPage />} />
          <Route path="/architecture" element={<Architecture stats={stats} />} />
          <Route path="/how-it-works" element={<HowItWorks />} />
          <Route path="*" element={<p>No such page.</p>} />
        </Routes>
      </main>
    </div>
  );
}
