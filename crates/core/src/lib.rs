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
//! - [`router`]: the facade tying them together, with `route`, `dispatch` and `explain`.

pub mod admission;
pub mod hashing;
pub mod index;
pub mod ledger;
pub mod policy;
pub mod router;
mod types;

pub use admission::{AdmissionConfig, AdmissionDecision, AdmissionMode, QueueState, RejectReason};
pub use hashing::{BlockedPrompt, EngineHash, LocalBlockHash, Namespace, SequenceHash};
pub use index::{
    ApproxConfig, ApproxIndex, BatchOutcome, IndexError, KvEvent, Matches, PrefixIndex,
    StoredBlocks,
};
pub use ledger::{Booking, EngineLoad, LedgerError, LoadLedger, WorkerCapacity, WorkerLoad};
pub use policy::{Policy, PolicyConfig, PolicyKind};
pub use router::{
    Explanation, RouteError, RouteOutcome, RouteRequest, Router, RouterConfig, Selection,
};
pub use types::{BlockSize, InvalidBlockSize, RequestId, Time, WorkerId};
