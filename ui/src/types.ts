// The shapes the kvroute load generator's API answers (see docs/loadgen.md). They are generated
// from the Rust types the API serializes into `types.generated.ts` (do not edit that file:
// `KVROUTE_WRITE_TS=1 cargo test -p kvroute-loadgen --test ts_types` rewrites it, and the same
// test fails while it differs from the Rust types). The UI imports them from here.

export type * from "./types.generated";

// Types only the UI has (none are sent by the server) go below this line.
