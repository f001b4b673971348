//! A connection's socket in blocking mode, shared by its request threads:
//! one reads requests at a time through a buffer (`Reader`), and replies
//! are gathered and written under a lock (`Writer`).

use super::Frame;
use crate::limits::Charge;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of small replies gathered into one write.
const WRITE_BUFFER: usize = 16 << 10;
/// Bytes read from the socket at a time.
const READ_BUFFER: usize = 64 << 10;

/// A TCP or Unix stream socket (a TLS connection reaches the session
/// through a Unix socket pair, `relay.rs`).
pub enum Wire {
    Tcp(std::net::TcpStream),
    Unix(UnixStream),
}

impl From<std::net::TcpStream> for Wire {
    fn from(s: std::net::TcpStream) -> Wire {
        Wire::Tcp(s)
    }
}

impl From<UnixStream> for Wire {
    fn from(s: UnixStream) -> Wire {
        Wire::Unix(s)
    }
}

impl Wire {
    /// Blocking from now on; a read waits at most `idle` (then fails with
    /// `WouldBlock`, so the reader can ask whether the connection is idle).
    pub fn prepare(&self, idle: Option<Duration>) -> std::io::Result<()> {
        match self {
            Wire::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(idle)
            }
            Wire::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(idle)
            }
        }
    }

    /// Reads what has arrived, without waiting (`WouldBlock` if nothing).
    fn recv_now(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        let fd = match self {
            Wire::Tcp(s) => s.as_raw_fd(),
            Wire::Unix(s) => s.as_raw_fd(),
        };
        // SAFETY: `buf` is valid for writes of its length, and `fd` is
        // this socket's, open while `self` lives.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    /// Ends reading (a blocked read returns EOF once the buffered bytes
    /// are read), or both ways (a blocked write fails).
    pub fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Wire::Tcp(s) => s.shutdown(how),
            Wire::Unix(s) => s.shutdown(how),
        };
    }
}

impl Read for &Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Tcp(s) => (&*s).read(buf),
            Wire::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Wire::Tcp(s) => (&*s).write(buf),
            Wire::Unix(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Wire::Tcp(s) => (&*s).write_vectored(bufs),
            Wire::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How a wait for bytes ended without them.
pub enum Short {
    /// End of stream before the first byte.
    Eof,
    /// The read timeout passed.
    Quiet,
    Err(std::io::Error),
}

/// The read side, owned by whichever request thread reads next: the
/// socket behind a read-ahead buffer.
pub struct Reader {
    wire: Arc<Wire>,
    buf: Box<[u8]>,
    /// `buf[start..end]` is received and not yet read.
    start: usize,
    end: usize,
}

/// Whether a read failed only because the read timeout passed.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Reader {
    pub fn new(wire: Arc<Wire>) -> Reader {
        Reader { wire, buf: vec![0; READ_BUFFER].into_boxed_slice(), start: 0, end: 0 }
    }

    /// Whether more bytes are received and not yet read.
    pub fn buffered(&self) -> bool {
        self.start < self.end
    }

    /// The bytes received and not yet read.
    pub fn received(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Takes into the buffer what the socket already holds, without
    /// waiting, until `want` bytes are received (at most the buffer's
    /// size) or nothing more has arrived.
    pub fn take_arrived(&mut self, want: usize) {
        if self.end - self.start >= want {
            return;
        }
        self.buf.copy_within(self.start..self.end, 0);
        (self.start, self.end) = (0, self.end - self.start);
        while self.end < want.min(self.buf.len()) {
            match self.wire.recv_now(&mut self.buf[self.end..]) {
                Ok(n) if n > 0 => self.end += n,
                _ => break,
            }
        }
    }

    /// Reads from the buffer, refilled from the socket when empty (a read
    /// as large as the buffer goes straight to the socket).
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.start == self.end {
            if out.len() >= self.buf.len() {
                return (&*self.wire).read(out);
            }
            let n = (&*self.wire).read(&mut self.buf)?;
            (self.start, self.end) = (0, n);
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }

    /// Fills `buf` from `filled` on, counting in `filled` what came.
    /// The read timeout returns `Quiet` (call again to go on); EOF
    /// before the first byte is `Eof`, after it an error.
    pub fn fill(&mut self, buf: &mut [u8], filled: &mut usize) -> Result<(), Short> {
        while *filled < buf.len() {
            match self.read(&mut buf[*filled..]) {
                Ok(0) if *filled == 0 => return Err(Short::Eof),
                Ok(0) => return Err(Short::Err(ErrorKind::UnexpectedEof.into())),
                Ok(n) => *filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if timed_out(&e) => return Err(Short::Quiet),
                Err(e) => return Err(Short::Err(e)),
            }
        }
        Ok(())
    }

    /// Reads all of `buf`, however long the client takes.
    pub fn exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut filled = 0;
        loop {
            return match self.fill(buf, &mut filled) {
                Ok(()) => Ok(()),
                Err(Short::Quiet) => continue,
                Err(Short::Eof) => Err(ErrorKind::UnexpectedEof.into()),
                Err(Short::Err(e)) => Err(e),
            };
        }
    }

    /// Reads and drops `n` bytes.
    pub fn discard(&mut self, mut n: u64) -> std::io::Result<()> {
        let mut scratch = vec![0u8; READ_BUFFER.min(n as usize)];
        while n > 0 {
            let k = scratch.len().min(n as usize);
            self.exact(&mut scratch[..k])?;
            n -= k as u64;
        }
        Ok(())
    }
}

/// The write side: replies gathered in a buffer, with the memory they
/// hold until they are on the socket.
pub struct Writer {
    wire: Arc<Wire>,
    buf: Vec<u8>,
    held: Vec<Charge>,
    /// A write failed: the connection is over and replies are dropped.
    broken: bool,
}

impl Writer {
    pub fn new(wire: Arc<Wire>) -> Writer {
        Writer { wire, buf: Vec::with_capacity(WRITE_BUFFER), held: Vec::new(), broken: false }
    }

    /// Adds a reply: gathered if it fits in the buffer, else written
    /// straight from its pieces after what is gathered. `Err` once the
    /// socket failed.
    pub fn push(&mut self, (reply, charge): Frame) -> std::io::Result<()> {
        if self.broken {
            return Err(ErrorKind::BrokenPipe.into());
        }
        if self.buf.len() + reply.len() <= WRITE_BUFFER {
            reply.copy_to(&mut self.buf);
            self.held.push(charge);
            return Ok(());
        }
        self.flush()?;
        let res = reply.write_to(&mut &*self.wire);
        self.failed(res)
    }

    /// Writes what is gathered and frees the memory it held.
    pub fn flush(&mut self) -> std::io::Result<()> {
        if self.broken {
            return Err(ErrorKind::BrokenPipe.into());
        }
        let res = (&*self.wire).write_all(&self.buf);
        self.buf.clear();
        self.held.clear();
        self.failed(res)
    }

    fn failed(&mut self, res: std::io::Result<()>) -> std::io::Result<()> {
        if res.is_err() {
            self.broken = true;
            self.buf = Vec::new();
            self.held.clear();
        }
        res
    }
}
