//! A real `redis-server` for tests, on a free loopback port, stopped when dropped. Included by path by the
//! tests that need one (checkpoint-transfer's store tests, the end-to-end tests). Without `redis-server` on
//! the PATH `RedisServer::start` prints that the test skipped and returns `None`, unless
//! `KVGATE_REQUIRE_REDIS=1` (set by `.ci/run`), where a missing server fails the test.
#![allow(
    clippy::disallowed_methods,
    reason = "a test helper waits for a real server and reads KVGATE_REQUIRE_REDIS"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process; killed and reaped on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts a server on a free loopback port (no persistence), waiting until it answers PING. `None`, with
    /// a message saying the test `test` skipped, when `redis-server` is not installed and
    /// `KVGATE_REQUIRE_REDIS` is not `1`.
    #[allow(clippy::print_stderr, reason = "a skipped test says so")]
    pub(crate) fn start(test: &str) -> Option<Self> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            assert!(
                std::env::var("KVGATE_REQUIRE_REDIS").as_deref() != Ok("1"),
                "{test}: redis-server is not installed and KVGATE_REQUIRE_REDIS=1; install it \
                 (apt-get install redis-server)"
            );
            eprintln!(
                "{test}: skipped, redis-server is not installed (apt-get install redis-server)"
            );
            return None;
        }
        let port = free_port();
        Some(Self::start_on(port))
    }

    /// Starts a server on `port` (a restart after `stop`).
    pub(crate) fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let server = Self { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        while !server
            .command(&["PING"])
            .is_ok_and(|reply| reply == "+PONG")
        {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Sends one command (inline arguments, no spaces in them) and returns the first reply line.
    pub(crate) fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut line = String::new();
        BufReader::new(&mut stream).read_line(&mut line)?;
        Ok(line.trim_end().to_string())
    }

    /// Sets the server's memory limit to `limit` (for example `4mb`) with writes refused beyond it.
    pub(crate) fn set_maxmemory(&self, limit: &str) {
        for (key, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", limit)] {
            let reply = self.command(&["CONFIG", "SET", key, value]);
            assert_eq!(
                reply.as_deref().ok(),
                Some("+OK"),
                "CONFIG SET {key} {value}"
            );
        }
    }

    /// Kills the server (its data is gone: no persistence) and waits for it to exit.
    pub(crate) fn stop(&mut self) {
        let _ignored = self.child.kill();
        let _ignored = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port is free");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}
