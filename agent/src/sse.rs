//! A reader of Server-Sent Events (the Sentinel's queue-event stream): bytes in, events out.
//! Only what that stream uses: `event:` and `data:` fields, comments (keep-alives), blank-line
//! separated blocks, any of the three line endings.

/// One event: its name (`message` when the block names none) and its data lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub data: String,
}

/// What a block of the stream was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    /// A comment-only block: the server is alive.
    KeepAlive,
}

/// An event block can be no longer than this: a server that sends more without a blank line is
/// not the Sentinel.
const MAX_BLOCK: usize = 64 * 1024;

#[derive(Default)]
pub struct SseReader {
    buffer: String,
    /// The start of a character split between two chunks.
    partial: Vec<u8>,
}

impl SseReader {
    /// Adds `bytes` and returns the blocks they complete; an error when a block grows past
    /// [`MAX_BLOCK`] or is not UTF-8.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Item>, String> {
        self.partial.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.partial) {
            Ok(text) => text.len(),
            // Only an incomplete character at the end may wait for the next chunk.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => return Err("the stream is not UTF-8".into()),
        };
        let rest = self.partial.split_off(complete);
        let text =
            String::from_utf8(std::mem::replace(&mut self.partial, rest)).expect("checked above");
        self.buffer.push_str(&text);
        // One line ending from here on; a lone \r at the end may be the first half of \r\n.
        let keep_cr = self.buffer.ends_with('\r');
        self.buffer = self.buffer.replace("\r\n", "\n");
        if keep_cr {
            self.buffer.pop();
        }
        self.buffer = self.buffer.replace('\r', "\n");
        if keep_cr {
            self.buffer.push('\r');
        }
        let mut items = Vec::new();
        while let Some(end) = self.buffer.find("\n\n") {
            let block: String = self.buffer.drain(..end + 2).collect();
            items.extend(parse_block(&block));
        }
        if self.buffer.len() > MAX_BLOCK {
            return Err(format!("an event longer than {MAX_BLOCK} bytes"));
        }
        Ok(items)
    }
}

fn parse_block(block: &str) -> Option<Item> {
    let mut name = None;
    let mut data: Option<String> = None;
    let mut any_line = false;
    for line in block.lines().filter(|l| !l.is_empty()) {
        any_line = true;
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => name = Some(value.to_string()),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            },
            _ => {}
        }
    }
    match (name, data) {
        (None, None) if any_line => Some(Item::KeepAlive),
        (None, None) => None,
        (name, data) => Some(Item::Event(Event {
            name: name.unwrap_or_else(|| "message".into()),
            data: data.unwrap_or_default(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, data: &str) -> Item {
        Item::Event(Event {
            name: name.into(),
            data: data.into(),
        })
    }

    #[test]
    fn events_and_keep_alives_across_chunks() {
        let mut r = SseReader::default();
        assert_eq!(r.feed(b"event: rose\ndata: {\"a\"").unwrap(), vec![]);
        assert_eq!(
            r.feed(b":1}\n\n: keep-alive\n\n").unwrap(),
            vec![event("rose", "{\"a\":1}"), Item::KeepAlive]
        );
        assert_eq!(
            r.feed(b"data: x\r\n").unwrap(),
            vec![],
            "not complete without the blank line"
        );
        assert_eq!(r.feed(b"data: y\r").unwrap(), vec![]);
        assert_eq!(r.feed(b"\n\r\n").unwrap(), vec![event("message", "x\ny")]);
    }

    #[test]
    fn a_block_that_never_ends_is_an_error() {
        let mut r = SseReader::default();
        assert!(r.feed(&vec![b'x'; MAX_BLOCK + 1]).is_err());
        assert!(SseReader::default().feed(b"\xff\n\n").is_err());
    }

    #[test]
    fn a_character_split_between_chunks_waits_for_its_end() {
        let mut r = SseReader::default();
        let text = "data: é\n\n".as_bytes();
        assert_eq!(r.feed(&text[..7]).unwrap(), vec![]);
        assert_eq!(r.feed(&text[7..]).unwrap(), vec![event("message", "é")]);
    }
}
