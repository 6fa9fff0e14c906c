//! The HTTP/1.1 head parser, its limits, the native route's target and the chunked tracker:
//! no input may panic, and what they say must hold together.
#![no_main]

use corral_edge::chunked::Chunked;
use corral_edge::head::{parse_head, Parsed};
use corral_edge::http1::{check_head, check_partial, infer_target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max_url = 64 + usize::from(data.first().copied().unwrap_or(0));
    let max_header = 128 + 4 * usize::from(data.get(1).copied().unwrap_or(0));
    match parse_head(data) {
        Parsed::Complete(head) => {
            assert!(head.len <= data.len());
            let _ = infer_target(&data[head.target.clone()]);
            if let Ok(facts) = check_head(data, &head, data.len(), max_url, max_header) {
                assert!(!(facts.chunked && facts.content_length.is_some()));
                if facts.chunked {
                    // The body after the head, split in two reads: the same end either way.
                    let body = &data[head.len..];
                    let mut whole = Chunked::default();
                    let all = whole.feed(body);
                    let cut = body.len() / 2;
                    let mut split = Chunked::default();
                    let first = split.feed(&body[..cut]);
                    if let (Ok(all), Ok(first)) = (all, first) {
                        if whole.done() && first == cut && !split.done() {
                            let second = split.feed(&body[cut..]);
                            assert_eq!(second.map(|n| n + cut), Ok(all));
                        }
                    }
                }
            }
        }
        Parsed::Partial => {
            let _ = check_partial(data, max_url, max_header);
        }
        Parsed::Invalid(_) => {}
    }
});
