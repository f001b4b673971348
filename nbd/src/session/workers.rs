//! A connection's request threads: at most `--threads`, started as the
//! connection needs them and ended with it. They take turns reading
//! (leader and followers): the thread whose turn it is reads one request,
//! hands the turn on, runs the request and writes its reply. The turn is
//! handed on by waking a waiting thread (or starting one) only when more
//! requests are already received, this one may wait long (a FLUSH, a
//! fetch from a bucket) or other threads are running requests; otherwise
//! it is left for whichever thread is done first, usually this one, so a
//! request alone on its connection costs no wake-up at all. (The last
//! condition keeps the socket read while a thread waits on the disk for
//! a pack with other requests in flight, as the reader task used to; a
//! cold sequential read by hand did not differ with or without it.)
//!
//! Writes of parts of blocks that arrive together and go on from each
//! other (into one block, or each right after the one before) run in a
//! row on one thread, in their order, and their replies go out together
//! after the last one ran:
//! a write of part of a block logs its own bytes, and spans that follow
//! each other in the block and in the data log join (`head/patch.rs`).
//! Spread over threads they reach the log interleaved, never join, and
//! past 16 spans the whole block is logged again: 64 MiB written in 1 KiB
//! requests at qd16 made a store of 393 MiB on 8 threads against 171 MiB
//! on one. (Two streams of small writes into different blocks of one
//! volume at the same time still interleave in its data log.)

use super::wire::{Reader, Wire, Writer};
use super::{Conn, Frame, Job, Read, cost, read_request};
use crate::limits::Charge;
use crate::negotiate::invalid;
use crate::proto::consts::REQUEST_HEADER_LEN;
use crate::proto::{self, Command, Request};
use parking_lot::{Condvar, Mutex};
use std::net::Shutdown;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// The most writes run in a row (a 64 KiB block in 512-byte writes is 128).
const MAX_RUN: usize = 256;

pub(super) struct Workers {
    conn: Conn,
    wire: Arc<Wire>,
    turn: Mutex<Turn>,
    /// Where threads without a turn wait for one.
    woken: Condvar,
    writer: Mutex<Writer>,
    /// Threads with replies on their way to the writer.
    coming: AtomicUsize,
    max: usize,
}

struct Turn {
    /// The reader, when no thread is reading.
    reader: Option<Reader>,
    /// Threads waiting for their turn.
    waiting: usize,
    /// Threads running requests.
    running: usize,
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
        let turn = Turn {
            reader: Some(Reader::new(wire.clone())),
            waiting: 0,
            running: 0,
            threads: 1,
            end: None,
        };
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
            loop {
                let (jobs, mut frames) = me.next(&alive);
                if jobs.is_empty() && frames.is_empty() {
                    break;
                }
                // A bug that panics outside a request (which fails alone
                // with EIO) ends the connection rather than leaving its
                // counts wrong and its other threads waiting.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // Every request of a run runs before any reply is
                    // written: none waits on the socket once admitted.
                    frames.extend(jobs.into_iter().map(Job::run));
                }));
                me.turn.lock().running -= 1;
                if ran.is_err() {
                    me.end(Err(invalid("internal error running requests")));
                    break;
                }
                me.reply(frames);
            }
            drop(alive);
        };
        std::thread::Builder::new().name("forkfs-nbd-req".into()).spawn(thread).map(drop)
    }

    /// Waits for this thread's turn and reads the next requests to run
    /// (one, or a run of writes of parts of blocks), with the replies of
    /// those answered without running; both empty once the connection
    /// ended. The thread counts as running until it has run them.
    fn next(self: &Arc<Self>, alive: &mpsc::Sender<()>) -> (Vec<Job>, Vec<Frame>) {
        let Some(mut rd) = self.my_turn() else { return (Vec::new(), Vec::new()) };
        let (mut jobs, mut replies, mut end) = (Vec::new(), Vec::new(), None);
        let mut charge = None;
        loop {
            match self.read(&mut rd, charge.take()) {
                Read::Job(job) => jobs.push(job),
                Read::Reply(frame) => replies.push(frame),
                Read::End(res) => end = Some(res),
            }
            if end.is_some() || jobs.len() >= MAX_RUN {
                break;
            }
            charge = next_goes_on(&mut rd, &jobs, &self.conn);
            if charge.is_none() {
                break;
            }
        }
        let more = rd.buffered();
        let mut t = self.turn.lock();
        t.reader = Some(rd);
        if let Some(res) = end {
            t.end.get_or_insert(res);
            self.woken.notify_all();
        } else if !jobs.is_empty() {
            // Someone must read on while this thread runs: when more is
            // received, when the request may wait long, and when others
            // are running (their clients are at depth; a request alone on
            // its connection keeps its thread).
            let quick = self.conn.export.is_quick(&jobs[0].req);
            if more || !quick || t.running > 0 {
                self.hand_on(&mut t, alive);
            }
        }
        if !jobs.is_empty() || !replies.is_empty() {
            t.running += 1;
        }
        (jobs, replies)
    }

    /// Reads the next request (paid for by `charge` if given).
    fn read(&self, rd: &mut Reader, charge: Option<Charge>) -> Read {
        // A panic here would keep the reader from every thread.
        let read = std::panic::AssertUnwindSafe(|| read_request(rd, &self.conn, charge));
        std::panic::catch_unwind(read).unwrap_or_else(|_| {
            tracing::error!(export = %self.conn.export.name, "reading a request panicked");
            Read::End(Err(invalid("internal error reading a request")))
        })
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

    /// Ends the connection (a stop, a failed socket, a bug): no more
    /// requests are read, and threads waiting for a turn end.
    pub(super) fn end(&self, res: std::io::Result<bool>) {
        let mut t = self.turn.lock();
        t.end.get_or_insert(res);
        self.wire.shutdown(Shutdown::Read);
        self.woken.notify_all();
    }

    /// Threads running requests (not counting those writing replies).
    pub(super) fn running(&self) -> usize {
        self.turn.lock().running
    }

    /// Writes replies. Small replies are gathered, and the last thread
    /// with replies on their way to the writer writes them out.
    fn reply(&self, frames: Vec<Frame>) {
        if frames.is_empty() {
            return;
        }
        self.coming.fetch_add(1, Ordering::AcqRel);
        let mut w = self.writer.lock();
        let mut res = frames.into_iter().try_for_each(|f| w.push(f));
        if self.coming.fetch_sub(1, Ordering::AcqRel) == 1 && res.is_ok() {
            res = w.flush();
        }
        drop(w);
        if let Err(e) = res {
            // The connection is gone: nothing more is read.
            self.end(Err(e));
        }
    }
}

/// Whether the next request, already received whole, is a quick write
/// of part of a block that goes on from `run` (quick writes): into the
/// block the run started in, or right after the run's last write; if so,
/// its memory, taken without waiting (the run's requests hold theirs
/// until they have run, so a run never waits for memory). It takes what
/// has arrived of the next request first (a run is not cut where the
/// read-ahead buffer happened to end), but never waits for it.
fn next_goes_on(rd: &mut Reader, run: &[Job], conn: &Conn) -> Option<Charge> {
    let ex = &conn.export;
    let block = u64::from(ex.block_size);
    let small =
        |r: &Request| r.command == Command::Write && ex.is_quick(r) && u64::from(r.length) < block;
    let (first, last) = (&run.first()?.req, &run.last()?.req);
    if block == 0 || !small(first) || !rd.buffered() {
        return None;
    }
    rd.take_arrived(REQUEST_HEADER_LEN);
    let header = rd.received().first_chunk::<REQUEST_HEADER_LEN>().map(proto::decode_request);
    let Some(Ok(next)) = header else { return None };
    let whole = REQUEST_HEADER_LEN + next.payload_len() as usize;
    rd.take_arrived(whole);
    let same_block = next.offset / block == first.offset / block;
    let follows = next.offset == last.offset + u64::from(last.length);
    if rd.received().len() < whole || !small(&next) || !(same_block || follows) {
        return None;
    }
    conn.budget.try_charge(cost(&next, conn.cfg.limits.max_request))
}
