//! The `/metrics` server under idle connections: they are held open while a scrape is answered at once, and
//! a server holding its limit of connections refuses more at once instead of queueing them.
#![allow(
    clippy::disallowed_methods,
    reason = "the tests time the server's answers on the wall clock"
)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

use super::serve;

/// How long a scrape may take while idle connections are open: well under the server's read timeout (1 s),
/// and far under the 5 s one idle connection used to cost.
const PROMPT: Duration = Duration::from_millis(500);

/// The client gives up on a response after this long (a server that waits out the idle connections first
/// fails the test here instead of hanging it).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET path` on `addr`: the whole response, or the client's error.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// `n` connections to `addr` that send nothing.
fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT).unwrap())
        .collect()
}

/// Whether the server still holds `stream` open: a read finds no data and no end of stream.
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let open =
        matches!((&*stream).read(&mut byte), Err(error) if error.kind() == ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    open
}

#[test]
fn a_scrape_is_answered_at_once_while_idle_connections_are_open() {
    let server = serve("127.0.0.1:0", Arc::new(Registry::default())).unwrap();
    let addr = server.local_addr();
    let idle = idle_connections(addr, 8);
    // Give the server time to take them all before the scrape arrives behind them.
    std::thread::sleep(Duration::from_millis(100));
    for (i, stream) in idle.iter().enumerate() {
        assert!(still_open(stream), "idle connection {i} is not open");
    }
    let started = Instant::now();
    let response = get(addr, "/metrics");
    let took = started.elapsed();
    let response = response.unwrap_or_else(|error| panic!("scrape failed after {took:?}: {error}"));
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("# EOF\n"), "{response}");
    assert!(
        took < PROMPT,
        "the scrape took {took:?} with 8 idle connections open"
    );
}

#[test]
fn an_idle_connection_is_closed_after_the_read_timeout() {
    let server = serve("127.0.0.1:0", Arc::new(Registry::default())).unwrap();
    let mut idle = TcpStream::connect_timeout(&server.local_addr(), CLIENT_TIMEOUT).unwrap();
    idle.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    // The server closes it without a word: the read sees the end of the stream.
    let read = idle.read_to_end(&mut rest);
    let took = started.elapsed();
    assert!(
        matches!(read, Ok(0)),
        "{read:?} {:?}",
        String::from_utf8_lossy(&rest)
    );
    assert!(
        took < Duration::from_secs(2),
        "closed after {took:?}, not about 1 s"
    );
}

#[test]
fn a_connection_beyond_the_limit_is_answered_503_at_once_and_a_freed_slot_serves_again() {
    let server = super::serve_at_most("127.0.0.1:0", Arc::new(Registry::default()), 2).unwrap();
    let addr = server.local_addr();
    let idle = idle_connections(addr, 2);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        idle.iter().all(still_open),
        "the idle connections are not open"
    );
    let started = Instant::now();
    let response = get(addr, "/metrics");
    let took = started.elapsed();
    // A 503; or, when the request crossed the server's close, a reset or a broken pipe.
    match &response {
        Ok(response) => assert!(
            response.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{response}"
        ),
        Err(error) => assert!(
            matches!(
                error.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ),
            "{error}"
        ),
    }
    assert!(took < PROMPT, "refused after {took:?}");
    // The idle connections time out and free their slots.
    drop(idle);
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        // Refused (a 503 or a broken connection) while the slots are still held.
        let response = get(addr, "/metrics");
        if response
            .as_ref()
            .is_ok_and(|response| response.starts_with("HTTP/1.1 200 OK\r\n"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "no slot freed: {response:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_trickles_its_request_is_dropped_at_the_deadline() {
    let server = serve("127.0.0.1:0", Arc::new(Registry::default())).unwrap();
    let mut slow = TcpStream::connect_timeout(&server.local_addr(), CLIENT_TIMEOUT).unwrap();
    let started = Instant::now();
    // One byte every 100 ms, never a whole line: each read is within the read timeout, the head never ends.
    let dropped = loop {
        if slow.write_all(b"G").is_err() || !still_open(&slow) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < CLIENT_TIMEOUT,
            "a trickling client is held open"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        dropped >= Duration::from_millis(900),
        "dropped after {dropped:?}"
    );
}
