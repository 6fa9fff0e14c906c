//! The HTTP edge on real loopback sockets, without Python: a thread answers the calls the
//! queue hands off, a fake bridge on a Unix socket answers the rest.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use corral_edge::shared::{Answer, Budget, Config, Shared};

struct Running {
    port: u16,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
    seen: Arc<parking_lot::Mutex<Vec<Vec<u8>>>>,
}

fn start(config: Config) -> Running {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let folder = std::env::temp_dir().join(format!("corral-edge-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&folder);
    let path = folder.join(format!("bridge-{}.sock", rand_suffix()));
    let _ = std::fs::remove_file(&path);
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let shared = Arc::new(Shared::new(
        Config {
            http_bridge: Some(path.to_string_lossy().into_owned()),
            ..config
        },
        Arc::new(Budget::new(1 << 30)),
    ));
    let port = runtime.block_on(async {
        // The fake bridge: reads a head (no body in these tests), answers "bridged".
        let bridge = tokio::net::UnixListener::bind(&path).expect("bind the bridge");
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = bridge.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    seen.lock().push(head);
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nbridged")
                        .await;
                });
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("an address").port();
        tokio::spawn(corral_edge::server::accept_http(
            listener,
            Arc::clone(&shared),
        ));
        port
    });
    // The "Python" side: answers every call with its model's name.
    let taker = Arc::clone(&shared);
    std::thread::spawn(move || loop {
        for call in taker.queue.take(Duration::from_millis(50)) {
            let body = format!("{{\"model\":\"{}\"}}", call.model).into_bytes();
            let lines = format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            )
            .into_bytes();
            let _ = call.reply.send(Answer::Http {
                status: 200,
                lines,
                body,
            });
        }
        if taker.stopping.is_raised() {
            return;
        }
    });
    Running {
        port,
        shared,
        _runtime: runtime,
        seen,
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn exchange(port: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(request).expect("write");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&answer);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    if length.is_some_and(|l| body.len() >= l) {
                        break;
                    }
                }
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.stopping.raise();
        self.shared.draining.raise();
    }
}

#[test]
fn native_and_bridged_requests() {
    let running = start(Config::default());
    let body = br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]}"#;
    let mut request = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let answer = exchange(running.port, &request);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\ndate: "), "{answer}");
    assert!(answer.ends_with("{\"model\":\"m\"}"), "{answer}");
    let answer = exchange(
        running.port,
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Corral-Peer: forged\r\n\r\n",
    );
    assert!(answer.ends_with("bridged"), "{answer}");
    let seen = running.seen.lock().clone();
    let head = String::from_utf8_lossy(&seen[0]).into_owned();
    assert!(head.starts_with("GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n"));
    assert!(head.contains("x-corral-peer: 127.0.0.1:") && !head.contains("forged"));
    drop(running);
}

#[test]
fn limits_answer_as_the_python_edge() {
    let running = start(Config {
        max_url_bytes: 10,
        ..Config::default()
    });
    let answer = exchange(running.port, b"GET /0123456789abc HTTP/1.1\r\n\r\n");
    assert_eq!(
        answer,
        "HTTP/1.1 414 Request-URI Too Long\r\ncontent-type: application/json\r\ncontent-length: 69\r\n\
         connection: close\r\n\r\n{\"error\":\"the request's URL is longer than 10 bytes (max_url_bytes)\"}"
    );
    let answer = exchange(running.port, b"NOT HTTP AT ALL\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("the request is not valid HTTP/1.1: "),
        "{answer}"
    );
}
