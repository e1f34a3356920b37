//! `serve`: a minimal HTTP server for `GET /metrics` on `std::net`, one thread, one request per connection.
//! Anything else is answered 404; a connection that sends nothing for 5 s is dropped.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::error::{Error, Result};

/// How long a client may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `/metrics` until dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The address it listens on (the port chosen when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ignored = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ignored = thread.join();
        }
    }
}

/// Listens on `addr` and answers `GET /metrics` with `registry` in the Prometheus text format, on a thread
/// of its own, until the returned server is dropped. `Error::Metrics` when `addr` cannot be bound.
pub fn serve(addr: &str, registry: Arc<Registry>) -> Result<MetricsServer> {
    let bind_error = |reason: String| Error::Metrics {
        addr: addr.to_string(),
        reason,
    };
    let listener = TcpListener::bind(addr).map_err(|e| bind_error(e.to_string()))?;
    let local = listener
        .local_addr()
        .map_err(|e| bind_error(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("kvgate-metrics".to_string())
        .spawn(move || {
            for stream in listener.incoming() {
                if stop_flag.load(Ordering::Acquire) {
                    break;
                }
                if let Ok(stream) = stream
                    && let Err(error) = answer(stream, &registry)
                {
                    tracing::debug!(%error, "metrics request not answered");
                }
            }
        })
        .map_err(|e| bind_error(e.to_string()))?;
    Ok(MetricsServer {
        addr: local,
        stop,
        thread: Some(thread),
    })
}

fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut request_line = String::new();
    let mut reader = BufReader::new(&mut stream);
    reader.read_line(&mut request_line)?;
    // Drain the headers, up to the blank line.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => {
            let mut body = String::new();
            prometheus_client::encoding::text::encode(&mut body, registry)
                .map_err(std::io::Error::other)?;
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            )
        }
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only GET /metrics is served\n".to_string(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
