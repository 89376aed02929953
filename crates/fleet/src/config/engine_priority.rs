//! Which values of the engine's own `priority` request field an engine serves first: vLLM
//! (`--scheduling-policy priority`) the lower; SGLang (`--enable-priority-scheduling`) the
//! higher, unless started with `--schedule-low-priority-values-first`.

use serde::{Deserialize, Serialize};

/// Which `priority` values an engine serves first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnginePriority {
    /// Lower values first (vLLM; SGLang with `--schedule-low-priority-values-first`).
    LowerFirst,
    /// Higher values first (SGLang's default).
    HigherFirst,
}

impl EnginePriority {
    /// The value to send for a class's `engine_priority` (lower = sooner).
    pub fn value(self, class_priority: i32) -> i64 {
        match self {
            EnginePriority::LowerFirst => i64::from(class_priority),
            EnginePriority::HigherFirst => -i64::from(class_priority),
        }
    }
}

impl std::str::FromStr for EnginePriority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lower_first" => Ok(Self::LowerFirst),
            "higher_first" => Ok(Self::HigherFirst),
            other => Err(format!(
                "priority={other:?} is not one of lower_first, higher_first"
            )),
        }
    }
}
