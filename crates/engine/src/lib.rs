//! The simulated inference engine: a GPU-free replica that behaves like vLLM at KV-block
//! level, driven in virtual or real time.
//!
//! Pure and steppable: [`Engine::submit`] queues a request, [`Engine::step`] advances to a
//! time and returns what happened (tokens, finished requests, KV events), and
//! [`Engine::next_event_time`] says when the engine next has something to report. No clock
//! is read: the fleet simulator drives it in virtual time, the worker in real time.
//!
//! - [`pool`]: the paged KV block pool with prefix caching, LRU eviction and KV events.
//! - [`engine`]: the continuous-batching scheduler (FCFS, chunked prefill, preemption).
//! - [`timing`]: step duration from the batch (roofline or polynomial).
//! - [`profile`]: hardware / model / limits profiles, shipped in `data/profiles.toml`.

pub mod engine;
pub mod pool;
pub mod profile;
pub mod timing;

pub use engine::{
    Engine, EngineConfig, EngineError, EngineMetrics, EnginePrompt, EngineRequest, Finished,
    StepOutput, TokenRuns, HOST_LOAD_SECS_PER_TOKEN, MAX_OUTPUT_IDS,
};
pub use pool::BlockPool;
pub use profile::{Profile, ProfileError};
pub use timing::{StepModel, StepShape};
