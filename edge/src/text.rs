//! Words and numbers as the Python edge writes them: `{"error": ...}` bodies (orjson's
//! escaping), Python's `%g` and `repr()` where its messages use them, uvicorn's status lines
//! and `date` header.

use std::time::{SystemTime, UNIX_EPOCH};

/// Appends `text` as a JSON string, escaped as orjson escapes it: `"` and `\`, the control
/// characters (`\b \t \n \f \r` by name, the others as lower-case `\u00xx`); everything else,
/// DEL and non-ASCII included, as it is.
pub fn push_json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..index]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 15)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = index + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `{"error":"<message>"}` as `orjson.dumps({"error": message})` writes it.
pub fn error_body(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 12);
    out.extend_from_slice(b"{\"error\":");
    push_json_string(&mut out, message);
    out.push(b'}');
    out
}

/// A float as Python's `format(value, "g")` writes it (six significant digits).
pub fn fmt_g(value: f64) -> String {
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".to_string()
        } else if value > 0.0 {
            "inf".to_string()
        } else {
            "-inf".to_string()
        };
    }
    let scientific = format!("{value:.5e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        let decimals = usize::try_from(5 - exponent).unwrap_or(0);
        strip_zeros(format!("{value:.decimals$}"))
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!(
            "{}e{sign}{:02}",
            strip_zeros(mantissa.to_string()),
            exponent.abs()
        )
    }
}

fn strip_zeros(text: String) -> String {
    if !text.contains('.') {
        return text;
    }
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Python's `repr()` of the `str` that `bytes.decode("latin-1")` makes of `raw`.
pub fn py_repr_latin1(raw: &[u8]) -> String {
    let has_single = raw.contains(&b'\'');
    let has_double = raw.contains(&b'"');
    let quote = if has_single && !has_double { '"' } else { '\'' };
    let mut out = String::with_capacity(raw.len() + 2);
    out.push(quote);
    for &byte in raw {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\'' if quote == '\'' => out.push_str("\\'"),
            // Not printable for str.isprintable: C0, DEL, C1, NO-BREAK SPACE, SOFT HYPHEN.
            0..=0x1f | 0x7f..=0xa0 | 0xad => out.push_str(&format!("\\x{byte:02x}")),
            _ => out.push(char::from(byte)),
        }
    }
    out.push(quote);
    out
}

/// uvicorn's status line: `HTTP/1.1 <code> <phrase>\r\n` (`http.HTTPStatus`'s phrase).
pub fn status_line(status: u16) -> Vec<u8> {
    let mut line = Vec::with_capacity(40);
    line.extend_from_slice(b"HTTP/1.1 ");
    line.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    line.push(b' ');
    line.extend_from_slice(reason_phrase(status).as_bytes());
    line.extend_from_slice(b"\r\n");
    line
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`) of `secs` since the epoch.
pub fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rest = secs % 86_400;
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[usize::try_from(days % 7).unwrap_or(0)],
        day,
        MONTHS[usize::try_from(month - 1).unwrap_or(0)],
        year,
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The current time's `date` header line as uvicorn writes it, remade once a second.
pub struct DateCache {
    /// The second last formatted, and its lines.
    line_lock: parking_lot::Mutex<(u64, Vec<u8>)>,
}

impl Default for DateCache {
    fn default() -> Self {
        Self {
            line_lock: parking_lot::Mutex::new((u64::MAX, Vec::new())),
        }
    }
}

impl DateCache {
    /// Appends `date: <now>\r\nserver: uvicorn\r\n`, uvicorn's default headers in its order.
    pub fn push_defaults(&self, out: &mut Vec<u8>) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut cached = self.line_lock.lock();
        if cached.0 != now {
            let mut lines = Vec::with_capacity(64);
            lines.extend_from_slice(b"date: ");
            lines.extend_from_slice(http_date(now).as_bytes());
            lines.extend_from_slice(b"\r\nserver: uvicorn\r\n");
            *cached = (now, lines);
        }
        out.extend_from_slice(&cached.1);
    }
}

/// `http.HTTPStatus(status).phrase`, or "" for a status it lacks.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Request Entity Too Large",
        414 => "Request-URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Requested Range Not Satisfiable",
        417 => "Expectation Failed",
        418 => "I'm a Teapot",
        421 => "Misdirected Request",
        422 => "Unprocessable Entity",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        510 => "Not Extended",
        511 => "Network Authentication Required",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_format_matches_python() {
        assert_eq!(fmt_g(10.0), "10");
        assert_eq!(fmt_g(0.5), "0.5");
        assert_eq!(fmt_g(1e-7), "1e-07");
        assert_eq!(fmt_g(123_456_789.0), "1.23457e+08");
        assert_eq!(fmt_g(30.0), "30");
        assert_eq!(fmt_g(0.0001), "0.0001");
    }

    #[test]
    fn repr_matches_python() {
        assert_eq!(py_repr_latin1(b"a'b"), "\"a'b\"");
        assert_eq!(py_repr_latin1(b"a\"b"), "'a\"b'");
        assert_eq!(py_repr_latin1(b"a'\"b"), "'a\\'\"b'");
        assert_eq!(
            py_repr_latin1(b"\xa0\xad\x80\xff\t\x7f"),
            "'\\xa0\\xad\\x80\u{ff}\\t\\x7f'"
        );
    }

    #[test]
    fn json_escapes_as_orjson() {
        let mut out = Vec::new();
        push_json_string(&mut out, "\u{8}\t\n\u{c}\r\u{b}\u{1b}\"\\/\u{7f}é");
        assert_eq!(
            out,
            b"\"\\b\\t\\n\\f\\r\\u000b\\u001b\\\"\\\\/\x7f\xc3\xa9\""
        );
    }

    #[test]
    fn dates() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(status_line(404), b"HTTP/1.1 404 Not Found\r\n");
        assert_eq!(status_line(599), b"HTTP/1.1 599 \r\n");
    }
}
