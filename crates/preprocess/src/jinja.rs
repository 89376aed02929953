//! Helpers that Hugging Face chat templates expect from their Jinja
//! environment: `raise_exception`, `strftime_now` and a Python-compatible
//! `tojson` filter.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The instant `strftime_now` formats: 2026-01-01 00:00:00 (a Thursday).
///
/// The library must not read clocks (the gateway and every worker have to
/// render the same prompt, whatever their clocks say), so templates that put
/// "today's date" in the system prompt always see this date.
pub const FIXED_DATE: &str = "2026-01-01T00:00:00";

/// `raise_exception(msg)`: aborts rendering with `msg` as the error message.
pub(crate) fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)`: formats [`FIXED_DATE`] with a C/Python `strftime`
/// format. Supported: `%Y %y %m %d %e %j %B %b %h %A %a %u %w %H %I %M %S %p
/// %F %T %D %R %Z %z %%`, and the glibc no-padding forms `%-d %-m %-H %-I
/// %-M %-S %-j`. Anything else is copied as is.
pub(crate) fn strftime_now(format: String) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (unpadded, spec) = match chars.next() {
            Some('-') => (true, chars.next()),
            other => (false, other),
        };
        let Some(spec) = spec else {
            out.push('%');
            if unpadded {
                out.push('-');
            }
            break;
        };
        let number = |padded: &'static str, plain: &'static str| -> &'static str {
            if unpadded {
                plain
            } else {
                padded
            }
        };
        let text = match spec {
            'Y' => "2026",
            'y' => "26",
            'm' | 'd' => number("01", "1"),
            'e' => " 1",
            'j' => number("001", "1"),
            'B' => "January",
            'b' | 'h' => "Jan",
            'A' => "Thursday",
            'a' => "Thu",
            'u' | 'w' => "4",
            'H' | 'M' | 'S' => number("00", "0"),
            'I' => "12",
            'p' => "AM",
            'F' => "2026-01-01",
            'T' => "00:00:00",
            'D' => "01/01/26",
            'R' => "00:00",
            'Z' | 'z' => "",
            '%' => "%",
            other => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
                continue;
            }
        };
        out.push_str(text);
    }
    out
}

/// `tojson` as Hugging Face defines it (`json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`): unlike minijinja's
/// built-in filter it does not HTML-escape `<`, `>`, `&` and `'`, and it uses
/// Python's default separators (`", "` and `": "`), so prompts match what
/// Python engines render. Keyword arguments: `indent` (int or string),
/// `separators` (two strings), `sort_keys`, `ensure_ascii`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_owned()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => (a.to_owned(), b.to_owned()),
                    _ => return Err(bad_separators()),
                },
                _ => return Err(bad_separators()),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let writer = JsonWriter {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    writer.write(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn bad_separators() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "tojson: separators must be a pair of strings",
    )
}

/// Python `json.dumps` formatting options.
struct JsonWriter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonWriter {
    fn write(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                let text = serde_json::to_string(value).map_err(|e| {
                    Error::new(ErrorKind::InvalidOperation, "tojson: bad number").with_source(e)
                })?;
                out.push_str(&text);
            }
            ValueKind::String => self.write_str(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, depth, '[', ']', &items, |item, out| {
                    self.write(item, depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_string(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, depth, '{', '}', &entries, |(key, item), out| {
                    self.write_str(key, out);
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out)
                })?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {} value is not JSON serializable", value.kind()),
                ))
            }
        }
        Ok(())
    }

    fn write_container<T>(
        &self,
        out: &mut String,
        depth: usize,
        open: char,
        close: char,
        items: &[T],
        mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(depth + 1, out);
            write_item(item, out)?;
        }
        self.newline(depth, out);
        out.push(close);
        Ok(())
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write_str(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// JSON object keys as Python converts them.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Ok(key.to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None | ValueKind::Undefined => Ok("null".to_owned()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_the_fixed_date() {
        assert_eq!(strftime_now("%d %b %Y".into()), "01 Jan 2026");
        assert_eq!(strftime_now("%-d %B %Y".into()), "1 January 2026");
        assert_eq!(
            strftime_now("%A, %F %T".into()),
            "Thursday, 2026-01-01 00:00:00"
        );
        assert_eq!(strftime_now("100%% %q %".into()), "100% %q %");
    }

    fn render(source: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(source, ctx).expect("renders")
    }

    #[test]
    fn tojson_is_python_compatible() {
        let ctx = Value::from_serialize(serde_json::json!({
            "x": {"b": [1, 2.5, "<a&b>"], "a": null, "c": true, "d": {}, "e": []}
        }));
        // Key order follows the map (sorted or insertion order, depending on
        // serde_json/minijinja features); sort_keys makes it deterministic.
        let compact = render("{{ x | tojson }}", ctx.clone());
        assert!(compact.contains("\"b\": [1, 2.5, \"<a&b>\"]"), "{compact}");
        assert!(compact.contains("\"a\": null"), "{compact}");
        let sorted = render("{{ x | tojson(sort_keys=true) }}", ctx.clone());
        assert_eq!(
            sorted,
            "{\"a\": null, \"b\": [1, 2.5, \"<a&b>\"], \"c\": true, \"d\": {}, \"e\": []}"
        );
        let sorted = render("{{ x | tojson(indent=2, sort_keys=true) }}", ctx.clone());
        assert_eq!(
            sorted,
            "{\n  \"a\": null,\n  \"b\": [\n    1,\n    2.5,\n    \"<a&b>\"\n  ],\n  \"c\": true,\n  \"d\": {},\n  \"e\": []\n}"
        );
        let tight = render(
            "{{ x.b | tojson(separators=[',', ':']) }}|{{ 'é\n' | tojson(ensure_ascii=true) }}",
            ctx,
        );
        assert_eq!(tight, "[1,2.5,\"<a&b>\"]|\"\\u00e9\\n\"");
    }
}
