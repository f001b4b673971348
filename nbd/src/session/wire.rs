//! A connection's socket in blocking mode, shared by its request threads:
//! one reads requests at a time through a buffer (`Reader`), and replies
//! are gathered and written under a lock (`Writer`).

use super::Frame;
use crate::limits::Charge;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::Shutdown;
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

/// The read side, owned by whichever request thread reads next.
struct Half(Arc<Wire>);

impl Read for Half {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&*self.0).read(buf)
    }
}

/// How a wait for bytes ended without them.
pub enum Short {
    /// End of stream before the first byte.
    Eof,
    /// The read timeout passed before the first byte.
    Quiet,
    Err(std::io::Error),
}

pub struct Reader {
    rd: BufReader<Half>,
}

/// Whether a read failed only because the read timeout passed.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Reader {
    pub fn new(wire: Arc<Wire>) -> Reader {
        Reader { rd: BufReader::with_capacity(READ_BUFFER, Half(wire)) }
    }

    /// Whether more bytes are received and not yet read.
    pub fn buffered(&self) -> bool {
        !self.rd.buffer().is_empty()
    }

    /// Fills `buf`. Before its first byte, EOF and the read timeout are
    /// reported as such; once a byte came, timeouts are waited out and
    /// EOF is an error.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<(), Short> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.rd.read(&mut buf[filled..]) {
                Ok(0) if filled == 0 => return Err(Short::Eof),
                Ok(0) => return Err(Short::Err(ErrorKind::UnexpectedEof.into())),
                Ok(n) => filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if timed_out(&e) && filled == 0 => return Err(Short::Quiet),
                Err(e) if timed_out(&e) => {}
                Err(e) => return Err(Short::Err(e)),
            }
        }
        Ok(())
    }

    /// Reads all of `buf`, however long the client takes.
    pub fn exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        loop {
            return match self.fill(buf) {
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
