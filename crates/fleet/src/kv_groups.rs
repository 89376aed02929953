//! Which of a worker's events say what prefix it can reuse: the device (GPU) tier of its
//! prefix group. Hybrid models (vLLM 0.30+) publish one stream of events per KV cache group,
//! with the same block hashes in each: a sliding-window or Mamba group drops blocks a full-
//! attention group keeps, so its removals must not remove the prefix, and its stores alone
//! make no hit. The first full-attention group a worker stores into becomes its prefix group;
//! other groups' events are counted and ignored. Events of offloaded tiers (CPU, disk) follow
//! the same rule; the caller sends them to the router's index of their tier.

use kvroute_protocol::kv_events::Event;

/// Per worker: the group whose blocks make its prefix cache, once known.
#[derive(Debug, Default)]
pub struct Groups {
    /// `Some(group)` once a prefix-group store was seen (`Some(None)`: an engine without
    /// group indices).
    prefix: Option<Option<i64>>,
}

/// Why an event is not applied: its metric `result` label.
pub type Ignored = &'static str;

impl Groups {
    /// Whether `e` goes to the index; else the reason it is ignored.
    pub fn judge(&mut self, e: &Event) -> Result<(), Ignored> {
        match e {
            Event::Stored(s) => {
                if !s.is_prefix_group() {
                    return Err("other_group");
                }
                let prefix = *self.prefix.get_or_insert(s.group_idx);
                if prefix == s.group_idx {
                    Ok(())
                } else {
                    Err("other_group")
                }
            }
            Event::Removed(r) => match (self.prefix, r.group_idx) {
                (Some(Some(p)), Some(g)) if p != g => Err("other_group"),
                _ => Ok(()),
            },
            Event::Cleared | Event::Unknown(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_protocol::kv_events::{Removed, Stored};

    fn stored(group: Option<i64>, kind: Option<&str>, window: Option<u64>) -> Event {
        Event::Stored(Stored {
            group_idx: group,
            spec_kind: kind.map(str::to_string),
            sliding_window: window,
            ..Stored::default()
        })
    }

    fn removed(group: Option<i64>, medium: Option<&str>) -> Event {
        Event::Removed(Removed {
            group_idx: group,
            medium: medium.map(str::to_string),
            ..Removed::default()
        })
    }

    #[test]
    fn a_hybrid_engine_counts_its_full_attention_group_only() {
        let mut g = Groups::default();
        // Sliding-window group 1 stores first: ignored, and it does not become the prefix.
        assert_eq!(
            g.judge(&stored(Some(1), Some("sliding_window"), Some(1024))),
            Err("other_group")
        );
        assert_eq!(
            g.judge(&stored(Some(2), Some("mamba"), None)),
            Err("other_group")
        );
        assert_eq!(
            g.judge(&stored(Some(0), Some("full_attention"), None)),
            Ok(())
        );
        // Another full-attention group repeats the same blocks: ignored.
        assert_eq!(
            g.judge(&stored(Some(3), Some("full_attention"), None)),
            Err("other_group")
        );
        // The sliding-window group's removals must not remove the prefix.
        assert_eq!(g.judge(&removed(Some(1), Some("GPU"))), Err("other_group"));
        assert_eq!(g.judge(&removed(Some(0), Some("GPU"))), Ok(()));
        assert_eq!(g.judge(&removed(None, None)), Ok(()));
        assert_eq!(g.judge(&Event::Cleared), Ok(()));
    }

    #[test]
    fn engines_without_groups_and_offloaded_tiers_follow_the_prefix_group() {
        let mut g = Groups::default();
        assert_eq!(g.judge(&stored(None, None, None)), Ok(()));
        assert_eq!(g.judge(&removed(None, Some("gpu"))), Ok(()));
        // Offloaded tiers follow the same rule (no groups here: everything goes in).
        assert_eq!(g.judge(&removed(None, Some("CPU"))), Ok(()));
        let storage = Stored {
            medium: Some("STORAGE".into()),
            ..Stored::default()
        };
        assert_eq!(g.judge(&Event::Stored(storage)), Ok(()));
        let mut grouped = Groups::default();
        assert_eq!(grouped.judge(&stored(Some(0), None, None)), Ok(()));
        assert_eq!(
            grouped.judge(&removed(Some(4), Some("CPU_PINNED"))),
            Err("other_group")
        );
        // MLA is full attention.
        let mut mla = Groups::default();
        assert_eq!(
            mla.judge(&stored(Some(0), Some("mla_attention"), None)),
            Ok(())
        );
    }
}
