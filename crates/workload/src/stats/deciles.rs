//! Saturation over time: requests cut into ten equal groups by arrival, with what each group
//! got. An overloaded fleet shows TTFT climbing decile after decile (an unbounded queue), or
//! rejections appearing (shedding) — two things one percentile over the whole run hides.

use super::{percentile, RequestRecord, Status};
use serde::Serialize;
use std::fmt::Write as _;

/// One tenth of the requests, by arrival order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decile {
    /// 1 to 10.
    pub decile: usize,
    /// Arrival of its first request, seconds.
    pub from_secs: f64,
    /// Requests in it.
    pub sent: usize,
    /// Of those, completed.
    pub completed: usize,
    /// Failed after dispatch.
    pub failed: usize,
    /// Rejected before dispatch.
    pub rejected: usize,
    /// Median TTFT of the completed ones, ms.
    pub ttft_p50_ms: Option<f64>,
    /// 95th percentile TTFT of the completed ones, ms.
    pub ttft_p95_ms: Option<f64>,
}

/// The ten deciles of `records` by arrival (fewer when there are fewer than ten requests).
pub fn deciles(records: &[RequestRecord]) -> Vec<Decile> {
    let mut by_arrival: Vec<&RequestRecord> = records.iter().collect();
    by_arrival.sort_by_key(|r| (r.arrival, r.id));
    let n = by_arrival.len();
    let groups = n.min(10);
    (0..groups)
        .map(|g| {
            let part = &by_arrival[g * n / groups..(g + 1) * n / groups];
            let mut ttft: Vec<f64> = part
                .iter()
                .filter(|r| r.status == Status::Completed)
                .filter_map(|r| r.ttft().map(|d| d.as_secs_f64() * 1e3))
                .collect();
            ttft.sort_by(f64::total_cmp);
            let count = |f: fn(&Status) -> bool| part.iter().filter(|r| f(&r.status)).count();
            Decile {
                decile: g + 1,
                from_secs: part.first().map_or(0.0, |r| r.arrival.as_secs_f64()),
                sent: part.len(),
                completed: count(|s| matches!(s, Status::Completed)),
                failed: count(|s| matches!(s, Status::Failed(_))),
                rejected: count(|s| matches!(s, Status::Rejected(_))),
                ttft_p50_ms: percentile(&ttft, 0.5),
                ttft_p95_ms: percentile(&ttft, 0.95),
            }
        })
        .collect()
}

/// The deciles as a Markdown table.
pub fn deciles_markdown(rows: &[Decile]) -> String {
    let mut s = String::from(
        "| decile | from s | sent | completed | failed | rejected | TTFT p50 ms | TTFT p95 ms |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    for d in rows {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            d.decile,
            d.from_secs,
            d.sent,
            d.completed,
            d.failed,
            d.rejected,
            ms(d.ttft_p50_ms),
            ms(d.ttft_p95_ms)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::{RequestId, Time};

    fn rec(i: u64, ttft_ms: Option<u64>, status: Status) -> RequestRecord {
        let mut r = RequestRecord::new(RequestId(i), Time::from_millis(i * 100), 10);
        r.first_token = ttft_ms.map(|t| Time::from_millis(i * 100 + t));
        r.status = status;
        r
    }

    #[test]
    fn a_growing_queue_and_shedding_show_by_decile() {
        // TTFT grows with arrival; the last fifth is shed.
        let records: Vec<RequestRecord> = (0..50)
            .map(|i| {
                if i >= 40 {
                    rec(i, None, Status::Rejected("all_workers_busy".into()))
                } else {
                    rec(i, Some(10 * (i + 1)), Status::Completed)
                }
            })
            .collect();
        let d = deciles(&records);
        assert_eq!(d.len(), 10);
        assert!(d.iter().all(|d| d.sent == 5));
        assert_eq!(d[0].ttft_p50_ms, Some(30.0));
        assert_eq!(d[7].ttft_p50_ms, Some(380.0));
        assert!(d[0].ttft_p50_ms < d[7].ttft_p50_ms);
        assert_eq!((d[8].rejected, d[8].ttft_p50_ms), (5, None));
        assert_eq!(d[9].from_secs, 4.5);
        let md = deciles_markdown(&d);
        assert_eq!(md.lines().count(), 12);
        assert!(md.contains("| 9 | 4.0 | 5 | 0 | 0 | 5 | - | - |"), "{md}");
        assert_eq!(deciles(&records[..3]).len(), 3);
        assert!(deciles(&[]).is_empty());
    }
}
