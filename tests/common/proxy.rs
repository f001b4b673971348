//! Bits of an HTTP/1.1 proxy for fault tests between forkfs and a real
//! S3 server: one request per connection, forwarded whole.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One request from a client: its head (with `Connection: close`, one
/// upstream connection per request) and body; `None` at end of stream.
pub fn read_request(rd: &mut BufReader<TcpStream>) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut head = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if rd.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue; // ours: one upstream connection per request
        }
        let end = line == "\r\n";
        if end {
            head.extend_from_slice(b"Connection: close\r\n");
        }
        head.extend_from_slice(line.as_bytes());
        if end {
            break;
        }
    }
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body)?;
    Ok(Some((head, body)))
}

/// Sends one request upstream; its whole answer.
pub fn forward(upstream: u16, head: &[u8], body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(head)?;
    up.write_all(body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    Ok(resp)
}

/// A proxy that forwards everything while `down` is clear, and closes every
/// connection at once while it is set (an unreachable object store).
pub fn switchable(upstream: u16, down: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if down.load(Ordering::SeqCst) {
                continue; // dropped: closed before a byte is read
            }
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut rd = BufReader::new(conn.try_clone()?);
                let mut wr = conn;
                let Some((head, body)) = read_request(&mut rd)? else { return Ok(()) };
                wr.write_all(&forward(upstream, &head, &body)?)
            });
        }
    });
    port
}

/// Brings a `switchable` proxy's store back when dropped (a failing
/// assertion must not leave a writer blocked for good).
pub struct Up(pub Arc<AtomicBool>);

impl Drop for Up {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
