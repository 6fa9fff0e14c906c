//! The gRPC ModelInfer plain check: no message may panic; what it accepts holds together.
#![no_main]

use bytes::Bytes;
use corral_edge::grpc::decode_plain;
use corral_edge::plain::element_count;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(call) = decode_plain(Bytes::copy_from_slice(data)) {
        for tensor in &call.request.inputs {
            let count = element_count(&tensor.shape, tensor.datatype.itemsize());
            assert_eq!(
                count.map(|c| c as usize * tensor.datatype.itemsize()),
                Some(tensor.data.as_bytes().len())
            );
        }
    }
});
