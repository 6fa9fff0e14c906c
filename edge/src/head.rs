//! The request head: parsed by httparse into ranges of its bytes, and invalid heads described
//! in the words the Python edge's refusal uses.

/// A request head, its parts as ranges of the head's bytes.
#[derive(Debug, Default)]
pub struct Head {
    /// Bytes of the head, its final CRLF included.
    pub len: usize,
    pub method: std::ops::Range<usize>,
    pub target: std::ops::Range<usize>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    pub headers: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

/// What reading a head found.
#[derive(Debug)]
pub enum Parsed {
    Complete(Head),
    Partial,
    Invalid(String),
}

fn offset(base: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    start..start + part.len()
}

/// Parses a request head at the start of `buf`.
pub fn parse_head(buf: &[u8]) -> Parsed {
    let mut few = [httparse::EMPTY_HEADER; 48];
    let mut request = httparse::Request::new(&mut few);
    match request.parse(buf) {
        Ok(status) => complete(buf, &request, status),
        Err(httparse::Error::TooManyHeaders) => {
            // Rare: as many headers as the head's bytes allow.
            let mut many = vec![httparse::EMPTY_HEADER; buf.len() / 3 + 1];
            let mut request = httparse::Request::new(&mut many);
            match request.parse(buf) {
                Ok(status) => complete(buf, &request, status),
                Err(error) => Parsed::Invalid(describe(error)),
            }
        }
        Err(error) => Parsed::Invalid(describe(error)),
    }
}

fn describe(error: httparse::Error) -> String {
    match error {
        httparse::Error::Token => "Invalid token in the request head".to_string(),
        httparse::Error::Version => "Invalid HTTP version".to_string(),
        httparse::Error::HeaderName => "Invalid header name".to_string(),
        httparse::Error::HeaderValue => "Invalid header value char".to_string(),
        httparse::Error::NewLine => "Invalid new line in the request head".to_string(),
        httparse::Error::Status => "Invalid status".to_string(),
        httparse::Error::TooManyHeaders => "Too many headers".to_string(),
    }
}

fn complete(
    buf: &[u8],
    request: &httparse::Request<'_, '_>,
    status: httparse::Status<usize>,
) -> Parsed {
    let httparse::Status::Complete(len) = status else {
        return Parsed::Partial;
    };
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Parsed::Invalid("Invalid request line".to_string());
    };
    Parsed::Complete(Head {
        len,
        method: offset(buf, method.as_bytes()),
        target: offset(buf, target.as_bytes()),
        version,
        headers: request
            .headers
            .iter()
            .map(|h| (offset(buf, h.name.as_bytes()), offset(buf, h.value)))
            .collect(),
    })
}
