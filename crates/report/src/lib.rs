//! kvroute benchmark reports.
//!
//! A sweep runs each routing policy at each fleet size and load level (a *cell*), once or
//! several times; this crate holds what comes out and how it is shown:
//! - [`figures`]: one run's figures (`Metrics`), flat, and their mean over runs;
//! - [`cell`]: cells and the sweep, with TSV and JSON renderings;
//! - [`markdown`]: the report with the reference A/B tables, Δ against a baseline policy,
//!   request accounting that never hides a failure, the highest load under an SLO and
//!   arrival deciles of saturated cells;
//! - [`plots`]: SVG and PNG plots;
//! - [`baseline`]: the baseline file the dashboard compares live figures with.
//!
//! Everything but [`plots::write_plots`] is pure.

pub mod baseline;
pub mod cell;
pub mod figures;
pub mod markdown;
pub mod plots;

pub use baseline::{Baseline, BaselineError, BaselinePoint, P50P95};
pub use cell::{Cell, Load, Sweep, SweepInfo, CELL_COLUMNS};
pub use figures::Metrics;
pub use markdown::{delta, markdown, max_load_under_slo, saturated};
pub use plots::{write_plots, PlotError};

#[cfg(test)]
mod tests;
