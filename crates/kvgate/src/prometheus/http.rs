//! `serve`: a minimal HTTP server for `GET /metrics` on `std::net`, one request per connection, in the format
//! the request's `Accept` header asks for (`exposition::negotiate`). An accept
//! thread hands each connection to a thread of its own, at most `CONNECTIONS_MAX` at once, so a client that
//! sends nothing never delays another's scrape; a connection beyond the limit is answered 503 at once.
//! Anything but `GET /metrics` is answered 404; a connection that has not sent its request head within
//! 1 s is dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

use super::exposition::{encode, negotiate};
use crate::error::{Error, Result};

/// How long a client may take to send its whole request head (request line and headers).
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// How long writing the response may block on a client that does not read it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes of a request head at most: a longer one is answered as far as it was read.
const REQUEST_BYTES_MAX: u64 = 8 * 1024;

/// Connections served at once at most, each on its own thread; one more is answered 503 at once.
const CONNECTIONS_MAX: usize = 64;

/// Stack of a connection's thread: it reads a request line and encodes the registry into a heap string.
const CONNECTION_STACK_BYTES: usize = 256 * 1024;

/// How long the accept loop pauses after a failed accept (out of file descriptors), instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

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
        // Wake the accept loop. Connection threads end on their own, within the read and write timeouts.
        let _ignored = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ignored = thread.join();
        }
    }
}

/// Listens on `addr` and answers `GET /metrics` with `registry` in the text format the scraper asks for
/// (OpenMetrics unless its `Accept` prefers the classic `text/plain; version=0.0.4`), on threads of
/// its own, until the returned server is dropped. `Error::Metrics` when `addr` cannot be bound.
pub fn serve(addr: &str, registry: Arc<Registry>) -> Result<MetricsServer> {
    serve_at_most(addr, registry, CONNECTIONS_MAX)
}

/// `serve`, with at most `connections_max` connections served at once.
fn serve_at_most(
    addr: &str,
    registry: Arc<Registry>,
    connections_max: usize,
) -> Result<MetricsServer> {
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
        .spawn(move || accept_loop(&listener, &stop_flag, &registry, connections_max))
        .map_err(|e| bind_error(e.to_string()))?;
    Ok(MetricsServer {
        addr: local,
        stop,
        thread: Some(thread),
    })
}

/// Takes connections until `stop` is set, each to a thread of its own while fewer than `connections_max`
/// are served; one more is answered 503 on this thread, which never reads from a client.
fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    registry: &Arc<Registry>,
    connections_max: usize,
) {
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "metrics connection not accepted");
                std::thread::sleep(ACCEPT_RETRY);
                continue;
            }
        };
        if open.load(Ordering::Acquire) >= connections_max {
            if let Err(error) = refuse(stream) {
                tracing::debug!(%error, "metrics connection not refused cleanly");
            }
            continue;
        }
        let slot = Slot::take(&open);
        let registry = Arc::clone(registry);
        let spawned = std::thread::Builder::new()
            .name("kvgate-metrics-conn".to_string())
            .stack_size(CONNECTION_STACK_BYTES)
            .spawn(move || {
                let _slot = slot;
                if let Err(error) = answer(stream, &registry) {
                    tracing::debug!(%error, "metrics request not answered");
                }
            });
        // The closure (the stream and the slot) is dropped when no thread could be made.
        if let Err(error) = spawned {
            tracing::debug!(%error, "no thread for a metrics connection");
        }
    }
}

/// One connection served: counted in `open` until dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Slot {
        open.fetch_add(1, Ordering::AcqRel);
        Slot(Arc::clone(open))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers a connection beyond the limit 503 without waiting for its request: what it sent so far is read
/// and dropped without blocking, so closing it does not reset the connection under the response.
fn refuse(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    respond(
        &mut stream,
        "503 Service Unavailable",
        "text/plain; charset=utf-8",
        "too many connections; try again\n",
    )?;
    stream.shutdown(Shutdown::Write)?;
    stream.set_nonblocking(true)?;
    let mut sent = [0u8; 1024];
    let mut left = REQUEST_BYTES_MAX;
    while left > 0 {
        match stream.read(&mut sent) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
    Ok(())
}

/// Reads one request head within `READ_TIMEOUT` of now and answers it.
fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    #[allow(
        clippy::disallowed_methods,
        reason = "a network deadline is wall time, outside the engine's clock"
    )]
    let deadline = Instant::now() + READ_TIMEOUT;
    let request = Deadline {
        stream: &stream,
        deadline,
    };
    let mut reader = BufReader::new(request.take(REQUEST_BYTES_MAX));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain the headers, up to the blank line (or the end of what may be read), keeping `Accept`.
    let mut header = String::new();
    let mut accept = None;
    while reader.read_line(&mut header)? > 2 {
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("accept")
        {
            accept = Some(value.trim().to_string());
        }
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => {
            let format = negotiate(accept.as_deref());
            let body = encode(registry, format).map_err(std::io::Error::other)?;
            respond(&mut stream, "200 OK", format.content_type(), &body)
        }
        _ => respond(
            &mut stream,
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only GET /metrics is served\n",
        ),
    }
}

/// Writes a whole response and closes the exchange.
fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Reads from a stream until a deadline: each read waits at most until then, and none starts after it, so
/// a client that trickles bytes cannot hold its connection past the deadline either.
#[derive(Debug)]
struct Deadline<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        #[allow(
            clippy::disallowed_methods,
            reason = "a network deadline is wall time, outside the engine's clock"
        )]
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request head not received in time",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

#[cfg(test)]
mod tests;
