//! The plain binary decoder: the first two bytes give the JSON part's length, the rest is the
//! body. No input may panic; the tensors it accepts are the body's bytes.
#![no_main]

use bytes::Bytes;
use corral_edge::plain::decode_http;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let header_length = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let body = Bytes::copy_from_slice(&data[2..]);
    if let Some(request) = decode_http(&body, Some(header_length)) {
        let total: usize = request.inputs.iter().map(|t| t.data.as_bytes().len()).sum();
        assert_eq!(header_length + total, body.len());
    }
});
