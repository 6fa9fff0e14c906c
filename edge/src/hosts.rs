//! The `Host` allow-list and the header checks of the native route, as
//! `corral/server/origins.py` (`host_name`, `SitePolicy.allows`, `check_post`) and
//! `requests.py` (`check_token`) make them; `tests/test_hosts_differential.py` holds
//! `host_name` and `allows` equal to the Python over many generated values.

/// Python's `str.isspace` (Unicode White_Space plus the four C0 separators).
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_strip(text: &str) -> &str {
    text.trim_matches(py_isspace)
}

fn is_port(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next() == Some(':') && text.len() > 1 && chars.all(|c| c.is_ascii_digit())
}

/// `host_name`: the name in a Host value or an allow-list entry, lowercase, without its
/// port; None if it names no host.
pub fn host_name(value: &str) -> Option<String> {
    let value = py_strip(value).to_lowercase();
    let name: &str = if let Some(rest) = value.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        if !after.is_empty() && !is_port(after) {
            return None;
        }
        &rest[..end]
    } else if value.matches(':').count() > 1 {
        &value
    } else {
        match value.split_once(':') {
            Some((name, port)) => {
                if !is_port(&format!(":{port}")) {
                    return None;
                }
                name
            }
            None => &value,
        }
    };
    if name.is_empty()
        || name
            .chars()
            .any(|c| " /\\@?#[]".contains(c) || (c as u32) < 33)
    {
        return None;
    }
    Some(name.to_string())
}

/// The names a server answers to (`SitePolicy`'s list semantics).
#[derive(Clone, Debug, Default)]
pub struct HostPolicy {
    any: bool,
    names: Vec<String>,
    suffixes: Vec<String>,
}

impl HostPolicy {
    /// The policy of an allow-list (None: any name); Err names an entry that is no host.
    pub fn new(allowed: Option<&[String]>) -> Result<Self, String> {
        let mut policy = Self {
            any: allowed.is_none(),
            ..Self::default()
        };
        for entry in allowed.unwrap_or(&[]) {
            let stripped = py_strip(entry);
            if stripped == "*" {
                policy.any = true;
            } else if stripped.starts_with("*.") {
                policy
                    .suffixes
                    .push(stripped.to_lowercase()[1..].to_string());
            } else {
                match host_name(entry) {
                    Some(name) => policy.names.push(name),
                    None => return Err(format!("allowed_hosts: {entry:?} is not a host name")),
                }
            }
        }
        Ok(policy)
    }

    /// The policy that answers every name.
    pub fn default_any() -> Self {
        Self {
            any: true,
            ..Self::default()
        }
    }

    /// Whether every name is answered.
    pub fn any(&self) -> bool {
        self.any
    }

    /// `SitePolicy.allows` of a Host header's raw value (read as latin-1, as the Python does).
    pub fn allows(&self, raw: &[u8]) -> bool {
        if self.any {
            return true;
        }
        let text: String = raw.iter().map(|&b| char::from(b)).collect();
        self.allows_text(&text)
    }

    /// `SitePolicy.allows` of a value already text.
    pub fn allows_text(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(name) = host_name(host) else {
            return false;
        };
        self.names.contains(&name)
            || self
                .suffixes
                .iter()
                .any(|suffix| name.ends_with(suffix.as_str()) || name == suffix[1..])
    }
}

/// Whether a Content-Type is the one `check_post` refuses on any POST (`text/plain`).
pub fn is_text_plain(value: &[u8]) -> bool {
    let media = value.split(|&b| b == b';').next().unwrap_or(b"");
    let media = media.trim_ascii();
    media.eq_ignore_ascii_case(b"text/plain")
}

/// Whether `value` is one of `accepted`: each compared in constant time, and all of them
/// compared, so that the time taken does not tell which one matched.
pub fn one_of(value: &[u8], accepted: &[Vec<u8>]) -> bool {
    accepted.iter().fold(false, |found, candidate| {
        found | constant_time_eq(value, candidate)
    })
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut difference = 0u8;
    for (x, y) in a.iter().zip(b) {
        difference |= x ^ y;
    }
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(host_name("[::1]:8000").as_deref(), Some("::1"));
        assert_eq!(host_name("::1").as_deref(), Some("::1"));
        assert_eq!(host_name(" LocalHost:80 ").as_deref(), Some("localhost"));
        assert_eq!(host_name("a:b"), None);
        assert_eq!(host_name("a b"), None);
        assert_eq!(host_name(""), None);
        let policy = HostPolicy::new(Some(&["localhost".into(), "*.example.com".into()]))
            .unwrap_or_default();
        assert!(policy.allows(b"localhost:8000"));
        assert!(policy.allows(b"example.com"));
        assert!(policy.allows(b"a.example.com"));
        assert!(!policy.allows(b"evil.com"));
        assert!(is_text_plain(b" Text/Plain ; charset=utf-8"));
        assert!(!is_text_plain(b"application/json"));
    }

    #[test]
    fn tokens() {
        let accepted = vec![b"Bearer a".to_vec(), b"Bearer bc".to_vec()];
        assert!(one_of(b"Bearer a", &accepted));
        assert!(one_of(b"Bearer bc", &accepted));
        assert!(!one_of(b"Bearer b", &accepted));
        assert!(!one_of(b"Bearer a ", &accepted));
        assert!(!one_of(b"Bearer a", &[]));
    }
}
