//! Server-sent events: an incremental parser for the `data:` lines of an OpenAI stream, fed
//! with arbitrary byte chunks (a proxy reads them as they come), with a bound on line length.

/// The longest line accepted in a stream.
pub const MAX_SSE_LINE: usize = 4 << 20;

/// One event of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseEvent {
    /// A `data:` payload (the lines of one event joined with `\n`).
    Data(String),
    /// `data: [DONE]`.
    Done,
}

/// Why a stream could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line longer than [`MAX_SSE_LINE`].
    #[error("a stream line is longer than {MAX_SSE_LINE} bytes")]
    LineTooLong,
    /// A line that is not UTF-8.
    #[error("a stream line is not UTF-8")]
    NotUtf8,
}

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; pushes the events they complete onto `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        for &b in bytes {
            if b == b'\n' {
                self.end_line(out)?;
            } else {
                if self.line.len() >= MAX_SSE_LINE {
                    return Err(SseError::LineTooLong);
                }
                self.line.push(b);
            }
        }
        Ok(())
    }

    /// Ends the stream: an event not yet closed by a blank line is delivered.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let text = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if let Some(rest) = text.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => self.data = Some(rest.to_string()),
            }
        }
        // Comments (`:`), `event:`, `id:` and `retry:` lines carry nothing we use.
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if let Some(d) = self.data.take() {
            out.push(if d.trim() == "[DONE]" {
                SseEvent::Done
            } else {
                SseEvent::Data(d)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(text: &str, piece: usize) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(piece) {
            p.feed(chunk, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn events_are_the_same_however_the_bytes_are_cut() {
        let text =
            ": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: b\ndata: c\n\ndata: [DONE]\n\n";
        let want = vec![
            SseEvent::Data("{\"a\":1}".into()),
            SseEvent::Data("b\nc".into()),
            SseEvent::Done,
        ];
        for piece in 1..text.len() {
            assert_eq!(parse_in_pieces(text, piece), want, "piece {piece}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_delivered_and_bad_lines_are_errors() {
        assert_eq!(
            parse_in_pieces("data: x", 3),
            vec![SseEvent::Data("x".into())]
        );
        let mut p = SseParser::new();
        let mut out = Vec::new();
        assert_eq!(p.feed(b"data: \xff\n", &mut out), Err(SseError::NotUtf8));
        let mut p = SseParser::new();
        let long = vec![b'a'; MAX_SSE_LINE + 1];
        assert_eq!(p.feed(&long, &mut out), Err(SseError::LineTooLong));
    }
}
