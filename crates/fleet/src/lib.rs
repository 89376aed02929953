//! The gateway's state below routing: its settings, the routing table (the router and the
//! admission queue behind one owner), bookings, the workers' registry and standing, health
//! checks, capacity learning and membership (workers joining and leaving), with the types a
//! worker's event feed is made of and the index sink ingestion writes through.
//!
//! Layers, lowest first (ARCHITECTURE.md's table, guarded by `crates/cli/tests/modules.rs`):
//! settings and foundations; the routing table and what stands beside it; a worker's
//! standing; the fleet. Event ingestion (`kvroute-events`), the event plane
//! (`kvroute-plane`) and discovery (`kvroute-discovery`) build on this crate and are handed
//! its parts; none of them, nor this crate, knows the gateway that serves requests.

pub mod accuracy;
pub mod backoff;
pub mod bookings;
pub mod capacity;
pub mod clock;
pub mod config;
pub mod feed;
pub mod headers;
pub mod health;
pub mod kv_groups;
pub mod membership;
pub mod metrics;
pub mod models;
pub mod registry;
pub mod sequence;
pub mod sink;
pub mod table;
pub mod tasks;
pub mod upstream;
pub mod workers;
