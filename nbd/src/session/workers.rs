//! A connection's request threads: at most `--threads` threads that take
//! queued requests from one channel, started as the queue needs them and
//! ended with the connection. A thread that finds another request waiting
//! runs it without sleeping, so a deep queue costs no wake-up per request;
//! tokio's blocking pool grew a thread per request in flight (32 at a
//! queue depth of 32), which spent more time waking and parking on 2 cores
//! than running requests.

use super::Job;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

pub(super) struct Workers {
    tx: crossbeam::channel::Sender<Job>,
    rx: crossbeam::channel::Receiver<Job>,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
    max: usize,
}

impl Workers {
    pub(super) fn new(max: usize) -> Workers {
        let (tx, rx) = crossbeam::channel::unbounded();
        Workers { tx, rx, pending: Arc::default(), threads: Vec::new(), max: max.max(1) }
    }

    /// Requests queued or running.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Queues a request; a thread is started for it when every thread has
    /// a request already (queued or running: a thread about to wake for a
    /// queued one is not free) and there are fewer than the maximum.
    /// Without any thread (none could be started) it runs here.
    pub(super) fn submit(&mut self, job: Job) {
        if self.pending() >= self.threads.len() && self.threads.len() < self.max {
            let (rx, pending) = (self.rx.clone(), self.pending.clone());
            let rt = tokio::runtime::Handle::current();
            let spawned =
                std::thread::Builder::new().name("forkfs-nbd-req".into()).spawn(move || {
                    // Requests may start blocking tasks (the checkpoint after a
                    // flush) on the connection's runtime.
                    let _rt = rt.enter();
                    while let Ok(job) = rx.recv() {
                        // Counted down however the request ends.
                        let _done = Done(&pending);
                        job.run();
                    }
                });
            match spawned {
                Ok(h) => self.threads.push(h),
                Err(e) if self.threads.is_empty() => {
                    tracing::warn!(error = %e, "no thread for requests; running one in place");
                    return job.run();
                }
                Err(_) => {}
            }
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        // The receiver lives in `self`, so the channel is open.
        let _ = self.tx.send(job);
    }

    /// Waits until every queued request has run and the threads ended.
    pub(super) async fn finish(self) {
        let Workers { tx, rx, threads, .. } = self;
        drop((tx, rx));
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// Counts a request as no longer pending when dropped.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
