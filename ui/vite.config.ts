import { defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";

// The dashboard is served by the kvroute binary; `npm run dev` proxies the API to a running
// `kvroute demo` (dashboard port 8080).
export default defineConfig({
  plugins: [react()],
  build: { outDir: "dist", emptyOutDir: true },
  server: {
    proxy: {
      "/api": { target: "http://127.0.0.1:8080", ws: true },
      "/metrics": "http://127.0.0.1:8080",
    },
  },
  test: { environment: "jsdom", globals: true },
});
