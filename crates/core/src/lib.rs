//! kvroute routing core: the pure library that decides where a request goes.
//!
//! Everything here is deterministic and free of IO: no async runtime, no clock reads (time is
//! an argument, see [`Time`]), no environment reads. The live gateway and the fleet simulator
//! call this same code.
//!
//! - [`hashing`]: tokens to full blocks to local and chained sequence hashes.
//! - [`index`]: the prefix index fed by engine KV events ([`PrefixIndex`]) and its
//!   approximate, event-free variant ([`ApproxIndex`]).
//! - [`ledger`]: the per-worker load the router booked for in-flight requests.
//! - [`policy`]: routing policies behind one trait.
//! - [`admission`]: busy thresholds and the dispatch / queue / shed decision.
//! - [`tiers`]: KV tiers (device, host, disk), the indexes of offloaded blocks and the cost
//!   of loading them back.
//! - [`router`]: the facade tying them together, with `route`, `dispatch` and `explain`.
//!
//! ```
//! use kvroute_core::*;
//!
//! let mut router = Router::new(RouterConfig { block_size: 4, ..RouterConfig::default() })?;
//! for w in [1, 2] {
//!     router.add_worker(WorkerId(w), WorkerCapacity::default())?;
//! }
//! // Worker 2 reports that it cached two blocks of a prompt.
//! let tokens: Vec<u32> = (0..10).collect();
//! router.apply_event(WorkerId(2), &KvEvent::Stored(StoredBlocks {
//!     parent: None,
//!     block_hashes: vec![EngineHash(0xa), EngineHash(0xb)],
//!     token_ids: tokens[..8].to_vec(),
//!     block_size: 4,
//!     namespace: Namespace::default(),
//!     block_keys: Vec::new(),
//! }))?;
//! // A request with that prefix goes there.
//! let prompt = BlockedPrompt::new(&tokens, router.block_size(), Namespace::default());
//! let req = RouteRequest { prompt: &prompt, session: None, queue: QueueState::default(), eligible: &ANY_WORKER, flow: Default::default() };
//! let RouteOutcome::Dispatch(choice) = router.route(&req) else { unreachable!() };
//! assert_eq!((choice.worker, choice.cached_tokens), (WorkerId(2), 8));
//! // Book it, then release it as the stream progresses.
//! router.dispatch(RequestId(1), &req, &choice, Time::from_millis(0))?;
//! router.first_token(RequestId(1), Time::from_millis(30))?;
//! router.finish(RequestId(1), Time::from_millis(900))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod admission;
mod flat_table;
pub mod flow;
pub mod hashing;
pub mod index;
pub mod ledger;
pub mod policy;
pub mod router;
pub mod tiers;
mod types;

pub use admission::queue::{AdmissionQueue, Ask, Queued, Ticket};
pub use admission::{AdmissionConfig, AdmissionDecision, AdmissionMode, QueueState, RejectReason};
pub use hashing::{BlockedPrompt, EngineHash, LocalBlockHash, Namespace, SequenceHash};
pub use index::{
    ApproxConfig, ApproxIndex, BatchOutcome, IndexError, KvEvent, Matches, PrefixIndex,
    StoredBlocks, StoredHashed,
};
pub use ledger::{Booking, EngineLoad, LedgerError, LoadLedger, WorkerCapacity, WorkerLoad};
pub use policy::{Policy, PolicyConfig, PolicyKind};
pub use router::{
    peer_request_id, Explanation, PeerBooking, PeerStats, RouteError, RouteOutcome, RouteRequest,
    Router, RouterConfig, Selection, Tracking,
};
pub use tiers::{Loadable, Tier, TierConfig};
pub use types::{
    BlockSize, Eligible, InvalidBlockSize, RequestId, Time, WorkerId, WorkerRole, ANY_WORKER,
};
