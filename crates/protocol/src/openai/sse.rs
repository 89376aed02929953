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
    /// A line, or an event's data, longer than [`MAX_SSE_LINE`].
    #[error("a stream line or event is longer than {MAX_SSE_LINE} bytes")]
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
        let mut rest = bytes;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let (head, tail) = (&rest[..i], &rest[i + 1..]);
            if self.line.is_empty() {
                // The whole line is in this chunk: no copy.
                Self::check_len(head.len())?;
                self.end_line(head, out)?;
            } else {
                self.push(head)?;
                let line = std::mem::take(&mut self.line);
                let ended = self.end_line(&line, out);
                self.line = line;
                self.line.clear();
                ended?;
            }
            rest = tail;
        }
        self.push(rest)
    }

    /// Ends the stream: an event not yet closed by a blank line is delivered.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.end_line(&line, out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn check_len(len: usize) -> Result<(), SseError> {
        if len > MAX_SSE_LINE {
            return Err(SseError::LineTooLong);
        }
        Ok(())
    }

    /// Appends the start of a line whose end has not come yet.
    fn push(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        Self::check_len(self.line.len() + bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// One line, without its `\n`.
    fn end_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let text = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if let Some(rest) = text.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut self.data {
                Some(d) => {
                    // An event of many lines never closed is bounded like one line.
                    Self::check_len(d.len() + 1 + rest.len())?;
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
        // Many short data lines never closed by a blank line: bounded as one event.
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "b".repeat(1 << 16));
        let mut failed = None;
        for _ in 0..(MAX_SSE_LINE >> 16) + 2 {
            if let Err(e) = p.feed(line.as_bytes(), &mut out) {
                failed = Some(e);
                break;
            }
        }
        assert_eq!(failed, Some(SseError::LineTooLong));
        assert!(out.is_empty());
    }

    /// The events of a whole stream, line by line, as the format defines them.
    fn reference(text: &str) -> Vec<SseEvent> {
        let (mut out, mut data): (Vec<SseEvent>, Option<String>) = (Vec::new(), None);
        let flush = |data: &mut Option<String>, out: &mut Vec<SseEvent>| {
            if let Some(d) = data.take() {
                out.push(if d.trim() == "[DONE]" {
                    SseEvent::Done
                } else {
                    SseEvent::Data(d)
                });
            }
        };
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                flush(&mut data, &mut out);
            } else if let Some(rest) = line.strip_prefix("data:") {
                let rest = rest.strip_prefix(' ').unwrap_or(rest);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(rest);
                    }
                    None => data = Some(rest.to_string()),
                }
            }
        }
        flush(&mut data, &mut out);
        out
    }

    proptest::proptest! {
        #[test]
        fn any_stream_cut_anywhere_gives_the_reference_events(
            lines in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(String::new()),
                    "data: [a-z{}\":, ]{0,12}",
                    "data:[DONE]",
                    ": [a-z ]{0,6}",
                    "event: [a-z]{1,4}",
                    "\\PC{0,8}",
                ],
                0..24,
            ),
            crlf in proptest::collection::vec(proptest::bool::ANY, 24),
            cuts in proptest::collection::vec(1usize..40, 1..12),
        ) {
            let mut text = String::new();
            for (line, cr) in lines.iter().zip(&crlf) {
                text.push_str(line);
                text.push_str(if *cr { "\r\n" } else { "\n" });
            }
            let mut p = SseParser::new();
            let mut out = Vec::new();
            let mut rest = text.as_bytes();
            for &c in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (head, tail) = rest.split_at(c.min(rest.len()));
                p.feed(head, &mut out).unwrap();
                rest = tail;
            }
            p.finish(&mut out).unwrap();
            proptest::prop_assert_eq!(out, reference(&text));
        }
    }

    #[test]
    fn a_line_of_the_longest_length_passes_and_one_byte_more_fails_however_it_comes() {
        let mut line = vec![b'a'; MAX_SSE_LINE];
        line.push(b'\n');
        let mut out = Vec::new();
        assert_eq!(SseParser::new().feed(&line, &mut out), Ok(()));
        let mut p = SseParser::new();
        for piece in line.chunks(1 << 16) {
            assert_eq!(p.feed(piece, &mut out), Ok(()));
        }
        let mut longer = vec![b'a'; MAX_SSE_LINE + 1];
        longer.push(b'\n');
        assert_eq!(
            SseParser::new().feed(&longer, &mut out),
            Err(SseError::LineTooLong)
        );
        let mut p = SseParser::new();
        let failed = longer
            .chunks(1 << 16)
            .map(|piece| p.feed(piece, &mut out))
            .find(Result::is_err);
        assert_eq!(failed, Some(Err(SseError::LineTooLong)));
    }
}
