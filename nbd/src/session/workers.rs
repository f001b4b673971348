//! A connection's request threads: at most `--threads`, started as the
//! connection needs them and ended with it. They take turns reading
//! (leader and followers): the thread whose turn it is reads one request,
//! hands the turn on, runs the request and writes its reply. The turn is
//! handed on by waking a waiting thread (or starting one) only when more
//! requests are already received or this one may wait long (a FLUSH, a
//! fetch from a bucket); otherwise it is left for whichever thread is
//! done first, usually this one, so a request alone on its connection
//! costs no wake-up at all.

use super::wire::{Reader, Wire, Writer};
use super::{Conn, Frame, Job, Read, read_request};
use crate::negotiate::invalid;
use parking_lot::{Condvar, Mutex};
use std::net::Shutdown;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

pub(super) struct Workers {
    conn: Conn,
    wire: Arc<Wire>,
    turn: Mutex<Turn>,
    /// Where threads without a turn wait for one.
    woken: Condvar,
    writer: Mutex<Writer>,
    /// Threads with a reply on its way to the writer.
    coming: AtomicUsize,
    max: usize,
}

struct Turn {
    /// The reader, when no thread is reading.
    reader: Option<Reader>,
    /// Threads waiting for their turn.
    waiting: usize,
    threads: usize,
    /// How the connection ended, once it did.
    end: Option<std::io::Result<bool>>,
}

impl Workers {
    /// Starts the first thread; each holds a clone of `alive`.
    pub(super) fn start(
        conn: Conn,
        wire: Arc<Wire>,
        alive: mpsc::Sender<()>,
    ) -> std::io::Result<Arc<Workers>> {
        let max = conn.cfg.limits.threads.max(1);
        let turn =
            Turn { reader: Some(Reader::new(wire.clone())), waiting: 0, threads: 1, end: None };
        let w = Arc::new(Workers {
            conn,
            writer: Mutex::new(Writer::new(wire.clone())),
            wire,
            turn: Mutex::new(turn),
            woken: Condvar::new(),
            coming: AtomicUsize::new(0),
            max,
        });
        w.spawn(alive)?;
        Ok(w)
    }

    /// How the connection ended (after every thread did).
    pub(super) fn outcome(&self) -> std::io::Result<bool> {
        self.turn.lock().end.take().unwrap_or(Ok(false))
    }

    fn spawn(self: &Arc<Self>, alive: mpsc::Sender<()>) -> std::io::Result<()> {
        let me = self.clone();
        let thread = move || {
            let _rt = me.conn.rt.enter();
            while let Some(job) = me.next(&alive) {
                let frame = job.run();
                me.reply(frame);
            }
            drop(alive);
        };
        std::thread::Builder::new().name("forkfs-nbd-req".into()).spawn(thread).map(drop)
    }

    /// Waits for this thread's turn and reads the next request to run;
    /// `None` once the connection ended.
    fn next(self: &Arc<Self>, alive: &mpsc::Sender<()>) -> Option<Job> {
        loop {
            let mut rd = self.my_turn()?;
            // A panic here would keep the reader from every thread.
            let read = std::panic::AssertUnwindSafe(|| read_request(&mut rd, &self.conn));
            let got = std::panic::catch_unwind(read).unwrap_or_else(|_| {
                tracing::error!(export = %self.conn.export.name, "reading a request panicked");
                Read::End(Err(invalid("internal error reading a request")))
            });
            let more = rd.buffered();
            let mut t = self.turn.lock();
            t.reader = Some(rd);
            match got {
                Read::Job(job) => {
                    if more || !self.conn.export.is_quick(&job.req) {
                        self.hand_on(&mut t, alive);
                    }
                    return Some(job);
                }
                Read::Reply(frame) => {
                    drop(t);
                    self.reply(frame);
                }
                Read::End(res) => {
                    t.end.get_or_insert(res);
                    self.woken.notify_all();
                    return None;
                }
            }
        }
    }

    fn my_turn(&self) -> Option<Reader> {
        let mut t = self.turn.lock();
        loop {
            if t.end.is_some() {
                return None;
            }
            if let Some(rd) = t.reader.take() {
                return Some(rd);
            }
            t.waiting += 1;
            self.woken.wait(&mut t);
            t.waiting -= 1;
        }
    }

    /// Lets another thread read while this one runs its request.
    fn hand_on(self: &Arc<Self>, t: &mut Turn, alive: &mpsc::Sender<()>) {
        if t.waiting > 0 {
            self.woken.notify_one();
        } else if t.threads < self.max {
            match self.spawn(alive.clone()) {
                Ok(()) => t.threads += 1,
                Err(e) => tracing::warn!(error = %e, "no thread for requests"),
            }
        }
    }

    /// Writes a reply. Small replies are gathered, and the last thread
    /// with a reply on its way writes them out.
    fn reply(&self, frame: Frame) {
        self.coming.fetch_add(1, Ordering::AcqRel);
        let mut w = self.writer.lock();
        let mut res = w.push(frame);
        if self.coming.fetch_sub(1, Ordering::AcqRel) == 1 && res.is_ok() {
            res = w.flush();
        }
        drop(w);
        if let Err(e) = res {
            // The connection is gone: nothing more is read.
            let mut t = self.turn.lock();
            t.end.get_or_insert(Err(e));
            self.wire.shutdown(Shutdown::Read);
            self.woken.notify_all();
        }
    }
}
