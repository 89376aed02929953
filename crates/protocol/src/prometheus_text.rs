//! Prometheus' text exposition format (0.0.4), read: the `/metrics` of engines (vLLM, SGLang)
//! and of kvroute's own workers and gateways. The one reader of metrics text in kvroute: the
//! gateway learns capacities with it, the dashboard reads its fleet with it, tests read
//! values with it.
//!
//! A text is read one sample line at a time (`name{label="value",...} value [timestamp]`):
//! comments, blank lines and lines that do not parse are skipped, so a bad or cut line costs
//! only itself, never the rest of the text. Metric names may hold colons (vLLM's `vllm:`,
//! SGLang's `sglang:`); label values are quoted with `\\`, `\"` and `\n` escapes (anything
//! may stand inside the quotes, `}` and `,` too); values are Go floats (`NaN`, `+Inf`,
//! `-Inf`); a timestamp may follow. `HELP` and `TYPE` lines are not needed by any reader and
//! are skipped: a histogram is its `_bucket` (with `le="+Inf"`), `_sum` and `_count` samples.
//!
//! Untrusted input: nothing panics, the work is linear in the text, and nothing is allocated
//! but a label value that holds escapes, when it is asked for. Callers bound the text they
//! read.
//!
//! Why not a crate (checked 2026-11 against a real vLLM 0.32 `/metrics`,
//! `crates/cli/tests/fixtures/vllm-0.32.0-metrics.txt`): `prometheus-parse` 0.2.5 reads none
//! of vLLM's samples (metric names are `\w+` to it, so `vllm:...` lines are dropped) and splits
//! labels at every `,` and `=`; `openmetrics-parser` 0.5.1 (LGPL-3.0, so not for a static
//! Apache-2.0 binary), `prom_text_format_parser` 0.1.0 (keeps label escapes unread) and
//! `nom-openmetrics` 0.3.0 (no timestamps, prints to stderr on every infinite value) read a
//! text whole or not at all: a cut body, one broken line, an empty body or CRLF line ends
//! lose every value. The tests hold those inputs.

use std::borrow::Cow;

/// One sample line: its metric name, its labels and its value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name (`vllm:num_requests_running`, `x_bucket`, `x_count`, ...).
    pub name: &'a str,
    /// The text between the braces, checked: `label="value"` pairs, commas between.
    labels: &'a str,
    /// The value.
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The labels in the order written, each value unescaped.
    pub fn labels(&self) -> Labels<'a> {
        Labels { rest: self.labels }
    }

    /// The value of label `name`, when the sample has it (the first, were it written twice).
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Whether the sample has exactly the labels of `selector` (a series as written in a
    /// metrics text: `name` or `name{a="x",b="y"}`; labels in any order). False when the
    /// selector does not parse.
    pub fn is_series(&self, selector: &str) -> bool {
        let Some((name, labels, "")) = head(selector) else {
            return false;
        };
        let wanted = Labels { rest: labels };
        name == self.name
            && wanted.clone().count() == self.labels().count()
            && wanted
                .into_iter()
                .all(|(n, v)| self.label(n).is_some_and(|mine| mine == v))
    }
}

/// A sample's labels: `(name, value)` pairs, values unescaped.
#[derive(Clone, Debug)]
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        // The text was checked by `label_list`: each step reads a comma and one pair.
        let s = self.rest.trim_start_matches(BLANK);
        let (name, raw, rest) = label_pair(s.strip_prefix(',').unwrap_or(s))?;
        self.rest = rest;
        Some((name, unescape(raw)))
    }
}

/// Every sample line of a metrics text, in order; other lines are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// The value of the first sample of metric `name`, whatever its labels.
pub fn first_value(text: &str, name: &str) -> Option<f64> {
    samples(text).find(|s| s.name == name).map(|s| s.value)
}

/// The value of series `selector` (`name`, or `name{a="x"}` with its labels in any order;
/// a name alone is the sample without labels).
pub fn series_value(text: &str, selector: &str) -> Option<f64> {
    samples(text)
        .find(|s| s.is_series(selector))
        .map(|s| s.value)
}

/// One line as a sample; None for comments, blank lines and lines that do not parse.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let (name, labels, rest) = head(line.trim_start_matches(BLANK))?;
    // At least one blank between the series and its value.
    let rest = rest.strip_prefix(BLANK)?;
    let mut fields = rest.split(BLANK).filter(|f| !f.is_empty());
    let value = go_float(fields.next()?)?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Blanks between tokens (`\r` for texts with CRLF line ends).
const BLANK: [char; 3] = [' ', '\t', '\r'];

/// A series at the start of `s`: its name, the checked text between its braces (empty
/// without), and what follows.
fn head(s: &str) -> Option<(&str, &str, &str)> {
    let end = s
        .char_indices()
        .find(|&(i, c)| {
            !(c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
        })
        .map_or(s.len(), |(i, _)| i);
    if end == 0 {
        return None;
    }
    let (name, rest) = s.split_at(end);
    let after_blanks = rest.trim_start_matches(BLANK);
    let Some(inner) = after_blanks.strip_prefix('{') else {
        return Some((name, "", rest));
    };
    let len = label_list(inner)?;
    Some((name, &inner[..len], &inner[len + 1..]))
}

/// The length of a checked label list that `s` starts with, up to (not including) its `}`.
fn label_list(s: &str) -> Option<usize> {
    let mut rest = s;
    loop {
        let trimmed = rest.trim_start_matches(BLANK);
        if trimmed.starts_with('}') {
            return Some(s.len() - trimmed.len());
        }
        let (_, raw, after) = label_pair(trimmed)?;
        check_escapes(raw)?;
        let after = after.trim_start_matches(BLANK);
        rest = match after.strip_prefix(',') {
            Some(next) => next,
            None if after.starts_with('}') => after,
            None => return None,
        };
    }
}

/// One `name="value"` pair at the start of `s` (blanks before it skipped): its name, its
/// value as written (escapes kept) and what follows the closing quote.
fn label_pair(s: &str) -> Option<(&str, &str, &str)> {
    let s = s.trim_start_matches(BLANK);
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())))
        .map_or(s.len(), |(i, _)| i);
    if end == 0 {
        return None;
    }
    let (name, rest) = s.split_at(end);
    let rest = rest.trim_start_matches(BLANK).strip_prefix('=')?;
    let rest = rest.trim_start_matches(BLANK).strip_prefix('"')?;
    let bytes = rest.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some((name, &rest[..i], &rest[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// Refuses escapes other than `\\`, `\"` and `\n`.
fn check_escapes(raw: &str) -> Option<()> {
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('\\' | '"' | 'n')) {
            return None;
        }
    }
    Some(())
}

/// A label value as written, unescaped (borrowed when it has no escapes).
fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    Cow::Owned(out)
}

/// A Go float as Prometheus writes it: digits, `NaN`, `+Inf`, `-Inf` (any case).
fn go_float(s: &str) -> Option<f64> {
    // Rust reads `inf`, `infinity` and `nan` in any case, with a sign; nothing but ASCII.
    s.parse().ok()
}

#[cfg(test)]
mod tests;
