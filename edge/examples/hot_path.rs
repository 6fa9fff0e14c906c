//! Times the edge's per-request work without sockets: the head's parse and checks, the
//! plain decoder and the answer's encoding, for the benchmark's request.
//! `cargo run --release --example hot_path --no-default-features`

use std::time::Instant;

use bytes::Bytes;
use corral_edge::encode::{http_body, Asked, Output, OutputType};
use corral_edge::head::{parse_head, Parsed};
use corral_edge::http1::check_head;
use corral_edge::plain::{decode_http, DataType};

fn main() {
    let body =
        br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1,4],"data":[0.1,0.2,0.3,0.4]}]}"#;
    let mut raw = format!(
        "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    let rounds = 1_000_000;
    let started = Instant::now();
    for _ in 0..rounds {
        let Parsed::Complete(head) = parse_head(std::hint::black_box(&raw)) else {
            panic!("complete");
        };
        let facts = check_head(&raw, &head, raw.len(), 8192, 65536);
        std::hint::black_box(facts.is_ok());
    }
    println!(
        "head: {:.0} ns",
        started.elapsed().as_nanos() as f64 / rounds as f64
    );
    let bytes = Bytes::copy_from_slice(body);
    let started = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(decode_http(std::hint::black_box(&bytes), None));
    }
    println!(
        "decode: {:.0} ns",
        started.elapsed().as_nanos() as f64 / rounds as f64
    );
    let data: Vec<u8> = [0.1f32, 0.2, 0.3]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let started = Instant::now();
    for _ in 0..rounds {
        let outputs = [Output {
            name: "Y",
            datatype: OutputType::Number(DataType::Fp32),
            shape: &[1, 3],
            data: &data,
        }];
        std::hint::black_box(http_body("tiny", None, None, &outputs, &Asked::default()).ok());
    }
    println!(
        "encode: {:.0} ns",
        started.elapsed().as_nanos() as f64 / rounds as f64
    );
}
