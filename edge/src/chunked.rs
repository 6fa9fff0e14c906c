//! Where a chunked body ends, read without decoding it: the bridge forwards such a body
//! byte for byte and must know its last byte to keep the connection in step.

/// The place in a chunked body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading a chunk's size (`digits` read so far; the value is in `Chunked::size`).
    Size {
        digits: u32,
    },
    /// After the size: an extension, until CR.
    Extension,
    /// CR of the size line seen: LF expected.
    SizeLf,
    /// In a chunk's data.
    Data(u64),
    /// After the data: CR expected.
    DataCr,
    /// After the data's CR: LF expected.
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    /// In a trailer line, until LF.
    Trailer,
    /// The final empty line's CR seen: LF expected.
    EndLf,
    Done,
}

/// Tracks a chunked body's framing.
#[derive(Clone, Debug)]
pub struct Chunked {
    state: State,
    size: u64,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0 },
            size: 0,
        }
    }
}

fn hex(byte: u8) -> Option<u64> {
    match byte {
        b'0'..=b'9' => Some(u64::from(byte - b'0')),
        b'a'..=b'f' => Some(u64::from(byte - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(byte - b'A' + 10)),
        _ => None,
    }
}

impl Chunked {
    /// Whether the body's last byte was read.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Reads `data`: how many of its bytes belong to the body (all, unless it ends in
    /// them), or what breaks the framing.
    pub fn feed(&mut self, data: &[u8]) -> Result<usize, &'static str> {
        let mut at = 0;
        while at < data.len() {
            let byte = data[at];
            self.state = match self.state {
                State::Done => return Ok(at),
                State::Size { digits } => match (hex(byte), digits) {
                    (Some(_), 15..) => return Err("Chunk size overflow"),
                    (Some(digit), _) => {
                        self.size = self.size << 4 | digit;
                        State::Size { digits: digits + 1 }
                    }
                    (None, 0) => return Err("Invalid character in chunk size"),
                    (None, _) => match byte {
                        b'\r' => State::SizeLf,
                        b';' | b' ' | b'\t' => State::Extension,
                        _ => return Err("Invalid character in chunk size"),
                    },
                },
                State::Extension => match byte {
                    b'\r' => State::SizeLf,
                    b'\n' => return Err("Invalid character in chunk extensions"),
                    _ => State::Extension,
                },
                State::SizeLf => {
                    if byte != b'\n' {
                        return Err("Expected LF after chunk size");
                    }
                    if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data(self.size)
                    }
                }
                State::Data(remaining) => {
                    let taken = ((data.len() - at) as u64).min(remaining);
                    at += taken as usize;
                    self.state = if taken == remaining {
                        State::DataCr
                    } else {
                        State::Data(remaining - taken)
                    };
                    continue;
                }
                State::DataCr => {
                    if byte != b'\r' {
                        return Err("Expected CRLF after chunk");
                    }
                    State::DataLf
                }
                State::DataLf => {
                    if byte != b'\n' {
                        return Err("Expected LF after chunk data");
                    }
                    self.size = 0;
                    State::Size { digits: 0 }
                }
                State::TrailerStart => match byte {
                    b'\r' => State::EndLf,
                    b'\n' => return Err("Expected CR before the body's end"),
                    _ => State::Trailer,
                },
                State::Trailer => match byte {
                    b'\n' => State::TrailerStart,
                    _ => State::Trailer,
                },
                State::EndLf => {
                    if byte != b'\n' {
                        return Err("Expected LF at the body's end");
                    }
                    self.state = State::Done;
                    return Ok(at + 1);
                }
            };
            at += 1;
        }
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_split() {
        let body = b"4;x=y\r\nWiki\r\n5\r\npedia\r\n0\r\nT: 1\r\n\r\nNEXT";
        let mut whole = Chunked::default();
        assert_eq!(whole.feed(body), Ok(body.len() - 4));
        assert!(whole.done());
        let mut split = Chunked::default();
        let mut used = 0;
        for byte in body.iter() {
            used += split.feed(std::slice::from_ref(byte)).unwrap_or(0);
            if split.done() {
                break;
            }
        }
        assert_eq!(used, body.len() - 4);
        assert!(Chunked::default().feed(b"zz\r\n").is_err());
        assert!(Chunked::default().feed(b"1\r\nab\r\n").is_err());
    }
}
