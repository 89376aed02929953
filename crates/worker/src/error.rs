//! The error type of starting and running a worker.

use kvroute_engine::{EngineError, ProfileError};
use kvroute_preprocess::PreprocessError;

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Unusable settings.
    #[error("invalid worker config: {0}")]
    Config(String),
    /// The engine profile is unknown or invalid.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The engine refused its settings.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The preprocessor failed (building the output vocabulary).
    #[error("preprocessor: {0}")]
    Preprocess(#[from] PreprocessError),
    /// A socket operation failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A ZMQ socket could not be bound.
    #[error("ZMQ: {0}")]
    Zmq(String),
}
