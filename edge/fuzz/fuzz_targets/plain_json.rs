//! The plain JSON decoder: no input may panic; what it accepts holds together.
#![no_main]

use bytes::Bytes;
use corral_edge::plain::{decode_http, element_count};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    if let Some(request) = decode_http(&body, None) {
        assert!(std::str::from_utf8(data).is_ok());
        for tensor in &request.inputs {
            let count = element_count(&tensor.shape, tensor.datatype.itemsize());
            let expected = count.map(|c| c as usize * tensor.datatype.itemsize());
            assert_eq!(expected, Some(tensor.data.as_bytes().len()));
            assert!(expected.unwrap_or(0) > 0);
        }
    }
});
