//! Raw NBD clients for what libnbd will not do (pipeline requests without
//! reading replies, stop mid-handshake), and the server's memory from
//! /proc.

use super::Server;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// `VmRSS` and `VmHWM` (peak) of the server, in KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).expect(name);
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The TCP address a server started with `--listen 127.0.0.1:0` logs.
    pub fn tcp_addr(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            // The last one: the log is appended to across restarts.
            if let Some(l) = log.lines().rev().find(|l| l.contains("listening (tcp)")) {
                let addr = l.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap();
                return addr.to_string();
            }
            assert!(Instant::now() < deadline, "no tcp listener: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (polling, up to `limit`) for the server to exit; its status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("server running");
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }
}

/// Reads the greeting and sends the client flags (fixed newstyle, no zeroes).
pub fn greet<S: Read + Write>(s: &mut S) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[..8], b"NBDMAGIC");
    s.write_all(&[0, 0, 0, 3]).unwrap();
}

/// The old-style attach (NBD_OPT_EXPORT_NAME): no structured replies, so a
/// READ's reply carries all its data. Returns the export size.
pub fn attach<S: Read + Write>(s: &mut S, export: &str) -> u64 {
    try_attach(s, export).unwrap()
}

/// [`attach`], or the error of a server that closed instead.
pub fn try_attach<S: Read + Write>(s: &mut S, export: &str) -> std::io::Result<u64> {
    greet(s);
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
    opt.extend_from_slice(export.as_bytes());
    s.write_all(&opt)?;
    let mut info = [0u8; 10];
    s.read_exact(&mut info)?;
    Ok(u64::from_be_bytes(info[..8].try_into().unwrap()))
}

/// A request header: `cmd` 0 READ, 1 WRITE, 3 FLUSH.
pub fn request(cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut r = [0u8; 28];
    r[..4].copy_from_slice(&0x2560_9513u32.to_be_bytes());
    r[6..8].copy_from_slice(&cmd.to_be_bytes());
    r[8..16].copy_from_slice(&cookie.to_be_bytes());
    r[16..24].copy_from_slice(&offset.to_be_bytes());
    r[24..28].copy_from_slice(&len.to_be_bytes());
    r
}

/// Reads one simple reply: (error, cookie).
pub fn simple_reply<S: Read>(s: &mut S) -> (u32, u64) {
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[..4].try_into().unwrap()), 0x6744_6698, "reply magic");
    (
        u32::from_be_bytes(r[4..8].try_into().unwrap()),
        u64::from_be_bytes(r[8..16].try_into().unwrap()),
    )
}
