//! The gateway's clock: every time the gateway reads (the router's `Time`, deadlines,
//! latencies) comes from one [`Clock`] given to its state, on tokio's time, so tests run on
//! paused time; the one live clock, `kvroute_runtime`'s (the worker's too).

pub use kvroute_runtime::Clock;
