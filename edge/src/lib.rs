//! corral's native edge: HTTP/1.1 and gRPC on tokio, the plain inference requests decoded
//! natively and handed to Python in groups, everything else bridged to the Python edge.
//! See `README.md`.

pub mod bridge;
pub mod chunked;
pub mod encode;
pub mod grpc;
pub mod head;
pub mod hosts;
pub mod http1;
pub mod pace;
pub mod pings;
pub mod plain;
#[cfg(feature = "python")]
mod python;
pub mod server;
pub mod shared;
pub mod text;
