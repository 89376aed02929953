//! What event ingestion and the event plane write through: the index sink handed to them
//! (the workers' registry and standing, the routing table, the event counters, the clock),
//! so neither knows the gateway.

use crate::bookings::Waiter;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::table::RoutingTable;
use crate::workers::Workers;
use std::sync::Arc;

/// What ingestion writes through: the workers' registry and standing, the routing table
/// (the index), the event counters; the replay service's time limit and the clock.
pub struct IndexSink {
    /// The workers.
    pub registry: Arc<Registry>,
    /// The router (its index) and the admission queue.
    pub table: Arc<RoutingTable<Waiter>>,
    /// What changes a worker's standing (verified after a re-synchronisation).
    pub workers: Arc<Workers>,
    /// The event counters.
    pub metrics: Arc<Metrics>,
    /// The gateway's clock.
    pub clock: Clock,
    /// How long a replay service may take to answer.
    pub replay_timeout: std::time::Duration,
}
