//! Mooncake trace replay: the JSONL request traces of the Mooncake FAST'25 release.
//!
//! One JSON object per line with the integer keys `timestamp` (milliseconds since the start
//! of the trace), `input_length` (prompt tokens), `output_length` (tokens to generate, used
//! as `max_tokens`) and `hash_ids` (one chained prefix-block id per 512-token block,
//! `len(hash_ids) == ceil(input_length / 512)`). Unknown keys are ignored, blank lines are
//! skipped. Each request becomes a [`Prompt::HashBlocks`] prompt, so equal ids give equal
//! token blocks and shared prefixes stay shared.
//!
//! The parser reads from any [`BufRead`] (the caller opens the file) and reports the first
//! malformed line as a [`TraceError`] with its 1-based line number.

use crate::prompt::Prompt;
use kvroute_core::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::time::Duration;

/// Largest accepted `input_length`, in tokens.
pub const MAX_INPUT_TOKENS: u64 = 10_000_000;
/// Largest accepted `output_length`, in tokens.
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;
/// Largest accepted `timestamp`: one year, in milliseconds.
pub const MAX_TIMESTAMP_MS: f64 = 365.0 * 24.0 * 3_600_000.0;
/// Longest accepted line, in bytes (a 10M-token prompt's ids fit well below it).
pub const MAX_LINE_BYTES: usize = 8 << 20;
/// The block size of the Mooncake release.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// How to read a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceOptions {
    /// Replay speed: a request's arrival is `timestamp / speedup` (2 = twice as fast). Finite
    /// and positive.
    pub speedup: f64,
    /// Drop requests whose `input_length` is larger.
    pub max_input_tokens: Option<usize>,
    /// Keep only the first K requests, counted after the length filter (the first K requests
    /// that pass it, in file order). Reading stops there: later lines are not checked.
    pub first: Option<usize>,
    /// Tokens per hash block (512 in the Mooncake release).
    pub block_tokens: usize,
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self {
            speedup: 1.0,
            max_input_tokens: None,
            first: None,
            block_tokens: MOONCAKE_BLOCK_TOKENS,
        }
    }
}

impl TraceOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return Err(format!(
                "speedup must be finite and positive, got {}",
                self.speedup
            ));
        }
        if self.block_tokens == 0 || self.block_tokens > kvroute_core::BlockSize::MAX {
            return Err(format!(
                "block_tokens must be between 1 and {}, got {}",
                kvroute_core::BlockSize::MAX,
                self.block_tokens
            ));
        }
        Ok(())
    }
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// When to send it (after the speed-up).
    pub arrival: Time,
    /// The prompt, as hash blocks.
    pub prompt: Prompt,
    /// Tokens to generate (`output_length`; send with ignore-eos).
    pub max_tokens: u32,
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    /// Not JSON, or not UTF-8.
    #[error("bad JSON: {0}")]
    Json(String),
    /// The line is JSON but not an object.
    #[error("expected a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// A required key is absent.
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    /// A key holds something that is not the required kind of number.
    #[error("field `{field}` must be {expected}, got {got}")]
    BadValue {
        /// The key.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it held (shortened).
        got: String,
    },
    /// A length is zero.
    #[error("field `{0}` must be positive, got 0")]
    Zero(&'static str),
    /// A value is beyond the accepted limit.
    #[error("field `{field}` is {value}, above the limit of {max}")]
    TooLarge {
        /// The key.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The limit.
        max: f64,
    },
    /// `hash_ids` does not hold one id per block.
    #[error(
        "`hash_ids` has {got} ids, but input_length {input_length} in blocks of {block_tokens} \
         needs ceil({input_length} / {block_tokens}) = {expected}"
    )]
    HashIdCount {
        /// `input_length`.
        input_length: u64,
        /// Tokens per block.
        block_tokens: usize,
        /// `ceil(input_length / block_tokens)`.
        expected: u64,
        /// `hash_ids.len()`.
        got: usize,
    },
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("line longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
}

/// Reading a trace failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The options are invalid.
    #[error("invalid trace options: {0}")]
    Options(String),
    /// A line is malformed.
    #[error("line {line}: {error}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        error: LineError,
    },
    /// The reader failed.
    #[error("reading line {line}: {source}")]
    Io {
        /// 1-based number of the line being read.
        line: usize,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

impl TraceError {
    /// The 1-based line number, for line and IO errors.
    pub fn line(&self) -> Option<usize> {
        match self {
            TraceError::Options(_) => None,
            TraceError::Line { line, .. } | TraceError::Io { line, .. } => Some(*line),
        }
    }
}

/// Parses a trace held in a string.
pub fn parse_str(text: &str, options: &TraceOptions) -> Result<Vec<TraceRequest>, TraceError> {
    parse_reader(text.as_bytes(), options)
}

/// Parses a trace from a reader, in file order (Mooncake traces are sorted by timestamp; the
/// parser does not reorder).
pub fn parse_reader(
    mut reader: impl BufRead,
    options: &TraceOptions,
) -> Result<Vec<TraceRequest>, TraceError> {
    options.validate().map_err(TraceError::Options)?;
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        if options.first.is_some_and(|k| out.len() >= k) {
            break;
        }
        line += 1;
        buf.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(|source| TraceError::Io { line, source })?;
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(TraceError::Line {
                line,
                error: LineError::TooLong,
            });
        }
        let req = parse_line(&buf, options).map_err(|error| TraceError::Line { line, error })?;
        if let Some(req) = req {
            if options
                .max_input_tokens
                .is_some_and(|max| req.prompt.len() > max)
            {
                continue;
            }
            out.push(req);
        }
    }
    Ok(out)
}

/// Parses one line (with or without its newline); `Ok(None)` for a blank line.
pub fn parse_line(bytes: &[u8], options: &TraceOptions) -> Result<Option<TraceRequest>, LineError> {
    let text = std::str::from_utf8(bytes).map_err(|e| LineError::Json(e.to_string()))?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| LineError::Json(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(LineError::NotAnObject(kind_of(&value)));
    };
    let timestamp = timestamp_ms(&obj)?;
    let input_length = length(&obj, "input_length", MAX_INPUT_TOKENS)?;
    let output_length = length(&obj, "output_length", MAX_OUTPUT_TOKENS)?;
    let ids = hash_ids(&obj)?;
    let expected = input_length.div_ceil(options.block_tokens as u64);
    if ids.len() as u64 != expected {
        return Err(LineError::HashIdCount {
            input_length,
            block_tokens: options.block_tokens,
            expected,
            got: ids.len(),
        });
    }
    // Whole nanoseconds: exact for integer milliseconds at speed-up 1.
    let nanos = (timestamp * 1e6 / options.speedup).round();
    let arrival = Time(Duration::from_nanos(nanos.min(u64::MAX as f64) as u64));
    Ok(Some(TraceRequest {
        arrival,
        prompt: Prompt::HashBlocks {
            ids,
            block_tokens: options.block_tokens,
            len: input_length as usize,
        },
        max_tokens: output_length as u32,
    }))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn shown(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 40 {
        let mut end = 40;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

fn field<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a Value, LineError> {
    obj.get(name).ok_or(LineError::MissingField(name))
}

/// `timestamp`: a non-negative number of milliseconds (integers in the release; fractions are
/// accepted).
fn timestamp_ms(obj: &Map<String, Value>) -> Result<f64, LineError> {
    let v = field(obj, "timestamp")?;
    let bad = || LineError::BadValue {
        field: "timestamp",
        expected: "a non-negative number of milliseconds",
        got: shown(v),
    };
    let ms = v.as_f64().ok_or_else(bad)?;
    if !ms.is_finite() || ms < 0.0 {
        return Err(bad());
    }
    if ms > MAX_TIMESTAMP_MS {
        return Err(LineError::TooLarge {
            field: "timestamp",
            value: ms,
            max: MAX_TIMESTAMP_MS,
        });
    }
    Ok(ms)
}

/// A positive integer length, at most `max`.
fn length(obj: &Map<String, Value>, name: &'static str, max: u64) -> Result<u64, LineError> {
    let v = field(obj, name)?;
    let n = v.as_u64().ok_or_else(|| LineError::BadValue {
        field: name,
        expected: "a positive integer",
        got: shown(v),
    })?;
    if n == 0 {
        return Err(LineError::Zero(name));
    }
    if n > max {
        return Err(LineError::TooLarge {
            field: name,
            value: n as f64,
            max: max as f64,
        });
    }
    Ok(n)
}

fn hash_ids(obj: &Map<String, Value>) -> Result<Vec<u64>, LineError> {
    let v = field(obj, "hash_ids")?;
    let Value::Array(items) = v else {
        return Err(LineError::BadValue {
            field: "hash_ids",
            expected: "an array of non-negative integers",
            got: shown(v),
        });
    };
    items
        .iter()
        .map(|item| {
            item.as_u64().ok_or_else(|| LineError::BadValue {
                field: "hash_ids",
                expected: "an array of non-negative integers",
                got: format!("element {}", shown(item)),
            })
        })
        .collect()
}

/// Totals of a parsed trace, comparable with the statistics in the trace folder's README.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceStats {
    /// Requests.
    pub requests: usize,
    /// Sum of prompt lengths.
    pub input_tokens: u64,
    /// Sum of `max_tokens`.
    pub output_tokens: u64,
    /// Arrival of the last request minus the first.
    pub span_secs: f64,
    /// Hash blocks over all requests.
    pub blocks: u64,
    /// Distinct hash ids.
    pub distinct_ids: usize,
    /// Fraction of blocks whose id appeared in an earlier request: the best hit rate of an
    /// infinite cache on one instance (None without blocks).
    pub ideal_block_hit_rate: Option<f64>,
    /// The same, weighting each hit block by its tokens (a partial tail block counts its
    /// remainder).
    pub ideal_token_hit_rate: Option<f64>,
}

impl TraceStats {
    /// Computes the totals, in the order given (file order).
    pub fn of(requests: &[TraceRequest]) -> Self {
        let mut s = TraceStats {
            requests: requests.len(),
            ..TraceStats::default()
        };
        let mut seen: HashSet<u64> = HashSet::new();
        let (mut hit_blocks, mut hit_tokens, mut block_tokens_total) = (0u64, 0u64, 0u64);
        for r in requests {
            s.input_tokens += r.prompt.len() as u64;
            s.output_tokens += u64::from(r.max_tokens);
            let Prompt::HashBlocks {
                ids, block_tokens, ..
            } = &r.prompt
            else {
                continue;
            };
            let len = r.prompt.len();
            // New ids are recorded after the request: repeats inside one request are not hits.
            let mut fresh = Vec::new();
            for (i, &id) in ids.iter().enumerate() {
                let tokens = len.saturating_sub(i * block_tokens).min(*block_tokens) as u64;
                s.blocks += 1;
                block_tokens_total += tokens;
                if seen.contains(&id) {
                    hit_blocks += 1;
                    hit_tokens += tokens;
                } else {
                    fresh.push(id);
                }
            }
            seen.extend(fresh);
        }
        s.distinct_ids = seen.len();
        if let (Some(first), Some(last)) = (requests.first(), requests.last()) {
            s.span_secs = last.arrival.since(first.arrival).as_secs_f64();
        }
        s.ideal_block_hit_rate = ratio(hit_blocks, s.blocks);
        s.ideal_token_hit_rate = ratio(hit_tokens, block_tokens_total);
        s
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// Spreads the requests that share an arrival time evenly over the `window` after it, in
/// their order (the Mooncake traces' timestamps come in steps of seconds: a step's requests
/// arrived over it, not at one instant), then keeps the trace in arrival order (stable).
pub fn spread_bursts(requests: &mut [TraceRequest], window: std::time::Duration) {
    let mut i = 0;
    while i < requests.len() {
        let t = requests[i].arrival;
        let n = requests[i..].iter().take_while(|r| r.arrival == t).count();
        for (k, r) in requests[i..i + n].iter_mut().enumerate() {
            r.arrival = t.plus(window.mul_f64(k as f64 / n as f64));
        }
        i += n;
    }
    requests.sort_by_key(|r| r.arrival);
}

#[cfg(test)]
mod tests;
