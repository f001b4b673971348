//! A connection's request threads: a few threads that take queued
//! requests from one channel, started as the queue needs them. A thread
//! that finds another request waiting runs it without sleeping, so a deep
//! queue costs no wake-up per request; tokio's blocking pool grew a
//! thread per request in flight (32 at a queue depth of 32), which spent
//! more time waking and parking on 2 cores than running requests.

use super::Job;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

pub(super) struct Workers {
    tx: crossbeam::channel::Sender<Job>,
    rx: crossbeam::channel::Receiver<Job>,
    /// Threads waiting for a request.
    idle: Arc<AtomicUsize>,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
    max: usize,
}

impl Workers {
    pub(super) fn new(max: usize) -> Workers {
        let (tx, rx) = crossbeam::channel::unbounded();
        let (idle, pending) = Default::default();
        Workers { tx, rx, idle, pending, threads: Vec::new(), max: max.max(1) }
    }

    /// Requests queued or running.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Queues a request; a thread is started for it if none is waiting
    /// and there are fewer than the maximum. Without a thread (none could
    /// be started) it runs here.
    pub(super) fn submit(&mut self, job: Job) {
        if self.idle.load(Ordering::Acquire) == 0 && self.threads.len() < self.max {
            let (rx, idle, pending) = (self.rx.clone(), self.idle.clone(), self.pending.clone());
            let rt = tokio::runtime::Handle::current();
            let spawned =
                std::thread::Builder::new().name("forkfs-nbd-req".into()).spawn(move || {
                    // Requests may start blocking tasks (the checkpoint after a
                    // flush) on the connection's runtime.
                    let _rt = rt.enter();
                    loop {
                        idle.fetch_add(1, Ordering::AcqRel);
                        let job = rx.recv();
                        idle.fetch_sub(1, Ordering::AcqRel);
                        let Ok(job) = job else { return };
                        job.run();
                        pending.fetch_sub(1, Ordering::AcqRel);
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
