//! A ZMTP 3.1 peer written byte by byte, for what a libzmq socket would never send: a frame
//! header announcing more bytes than a socket may take, or a connection that goes silent.
//! It greets with the NULL mechanism and a `READY` naming its socket type, so the socket at
//! the other end takes the connection before the frame arrives.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The bytes a peer of `socket_type` (`"PUB"`, `"SUB"`, `"DEALER"`, ...) sends first: the
/// greeting (version 3.1, NULL mechanism) and a `READY` command.
pub fn hello(socket_type: &str) -> Vec<u8> {
    let mut out = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 1];
    out.extend_from_slice(b"NULL");
    out.resize(64, 0);
    let mut ready = vec![5u8];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    let len = u32::try_from(socket_type.len()).expect("a short socket type");
    ready.extend_from_slice(&len.to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    out.extend_from_slice(&[0x04, u8::try_from(ready.len()).expect("a short command")]);
    out.extend_from_slice(&ready);
    out
}

/// The header of a last message frame announcing `size` bytes (long form).
pub fn frame_header(size: u64) -> Vec<u8> {
    let mut out = vec![0x02];
    out.extend_from_slice(&size.to_be_bytes());
    out
}

/// A message of `frames` as ZMTP writes it (short or long frame headers as the size needs).
pub fn message(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { 0x01 } else { 0 };
        match u8::try_from(f.len()) {
            Ok(n) => out.extend_from_slice(&[more, n]),
            Err(_) => {
                out.push(more | 0x02);
                out.extend_from_slice(&(f.len() as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(f);
    }
    out
}

/// A TCP connection to a `tcp://host:port` endpoint, through the handshake as a
/// `socket_type` peer ([`handshake`]). Tries for up to 10 s: a socket bound on another
/// thread may not be listening yet.
pub fn connect(endpoint: &str, socket_type: &str) -> TcpStream {
    let addr = endpoint.trim_start_matches("tcp://");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut conn = loop {
        match TcpStream::connect(addr) {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("connecting to the ZMQ endpoint {endpoint}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    handshake(&mut conn, socket_type);
    conn
}

/// Greets as a `socket_type` peer and reads the other side's greeting and `READY` (within
/// 5 s). Frames sent before the peer's `READY` would be read as handshake commands, and the
/// connection dropped for that, not for what they hold.
pub fn handshake(conn: &mut TcpStream, socket_type: &str) {
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    conn.write_all(&hello(socket_type)).expect("greeting");
    let mut greeting = [0u8; 64];
    conn.read_exact(&mut greeting).expect("the peer's greeting");
    let mut flags = [0u8; 1];
    conn.read_exact(&mut flags).expect("the peer's READY");
    let size = if flags[0] & 0x02 != 0 {
        let mut size = [0u8; 8];
        conn.read_exact(&mut size).expect("the peer's READY");
        u64::from_be_bytes(size)
    } else {
        let mut size = [0u8; 1];
        conn.read_exact(&mut size).expect("the peer's READY");
        u64::from(size[0])
    };
    let mut body = vec![0u8; usize::try_from(size).expect("a small command")];
    conn.read_exact(&mut body).expect("the peer's READY");
    assert!(
        body.starts_with(b"\x05READY"),
        "the peer's first command: {body:?}"
    );
}

/// Announces a frame of `size` bytes on `conn`, then sends up to `send` bytes of it in
/// 64 KiB pieces: the number of bytes the peer took before it closed the connection (all of
/// `send` when it never did).
pub fn send_frame(conn: &mut TcpStream, size: u64, send: usize) -> usize {
    if conn.write_all(&frame_header(size)).is_err() {
        return 0;
    }
    let piece = vec![0u8; 64 << 10];
    let mut sent = 0;
    while sent < send {
        let n = piece.len().min(send - sent);
        if conn.write_all(&piece[..n]).is_err() {
            return sent;
        }
        sent += n;
    }
    sent
}

/// Reads (and drops) what the peer sends on `conn` for `wait`, or until it closes the
/// connection: the bytes read, and whether it closed it.
pub fn read_for(conn: &mut TcpStream, wait: Duration) -> (usize, bool) {
    let deadline = std::time::Instant::now() + wait;
    let mut sink = [0u8; 4096];
    let mut got = 0;
    conn.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");
    while std::time::Instant::now() < deadline {
        match conn.read(&mut sink) {
            Ok(0) => return (got, true),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}
