//! Many hosts on one object store: what a store on S3, GCS or Azure adds
//! to a local one. Each host keeps its own index and data log; the bucket
//! holds what they share.
//!
//! - [`lease`]: one writer per volume across hosts;
//! - [`publish`]: heads reach the bucket after the objects they name;
//! - [`import`]: what other hosts committed comes into the local index,
//!   and a head another host advanced replaces this host's.
//!
//! [`Remote`] is the service the layers above call. Every store with a
//! remote has one (S3/GCS/Azure, and a `file://` directory that other
//! store directories may share); the embedded default has none: one
//! process opens it at a time.
//!
//! Uses the heads (their storage and overlays), the records, the chunk
//! store, the database and the object stores below it.

pub mod import;
pub mod lease;
pub mod names;
pub mod publish;
pub mod view;

pub(crate) use import::attach;
pub use lease::Lease;

use crate::db::{Batch, Db};
use crate::error::{Error, ErrorKind, Result};
use crate::head::{Fence, Storage};
use crate::id::VolumeId;
use crate::objects::{Backend, keys};
use crate::records::{self, HeadRecord, VolumeRecord};
use parking_lot::{Mutex, MutexGuard};
use publish::Publisher;
use std::sync::Arc;
use std::time::Duration;

/// The remote side of a store: leases, head publishing and imports.
pub struct Remote {
    storage: Arc<Storage>,
    publisher: Arc<Publisher>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// How long uploads may make no progress before a sync gives up.
    stall: Duration,
    /// The periodic task a layer above gives it (absorbing other hosts'
    /// GC tombstones), stopped before the remote side closes.
    ticker: Mutex<Option<Ticker>>,
    /// When this process last compared its view with the bucket's.
    seen: Arc<Mutex<view::Seen>>,
    /// This host has registered with the bucket's GC in this process (see
    /// [`Remote::registration`]): until then it imports nothing.
    registered: Arc<std::sync::atomic::AtomicBool>,
}

/// A background task run every period until stopped.
struct Ticker {
    stop: Arc<(Mutex<bool>, parking_lot::Condvar)>,
    thread: std::thread::JoinHandle<()>,
}

/// A head's right to write its volume: the lease, and the remote side kept
/// alive while the head is (it publishes what the head commits).
struct Right {
    lease: Arc<Lease>,
    _remote: Arc<Remote>,
}

impl Fence for Right {
    fn check(&self) -> Result<()> {
        self.lease.check()
    }
}

impl Remote {
    /// Starts publishing in the background (heads an earlier process left
    /// unpublished go first).
    pub(crate) fn start(
        storage: Arc<Storage>,
        stall: Duration,
        lease_ttl: Duration,
    ) -> Result<Arc<Remote>> {
        let backend = storage.chunks.backend().clone();
        let publisher = Arc::new(Publisher::new(
            backend,
            storage.records.clone(),
            storage.db.clone(),
            lease_ttl,
        ));
        let thread = publisher.spawn()?;
        publisher.kick();
        Ok(Arc::new(Remote {
            storage,
            publisher,
            thread: Mutex::new(Some(thread)),
            stall,
            ticker: Mutex::new(None),
            seen: Arc::default(),
            registered: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }))
    }

    /// Whether this host is registered with the bucket's GC, for the
    /// layer that registers it (`store/absorb.rs`): set to false when the
    /// bucket was out of reach at open, and true once a later registration
    /// succeeded. Until then imports fail as unavailable: a host indexes
    /// nothing of the bucket's before every GC waits for it, and a host
    /// back after the GC host timeout learns what it lost first.
    pub(crate) fn registration(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.registered.clone()
    }

    /// Runs `task` now and then every `every` (at the pace of lease
    /// renewals) on a thread of its own, until the remote side closes.
    /// The task must hold no `Store`: it would keep the store open.
    pub(crate) fn start_ticker(
        &self,
        every: Duration,
        task: Box<dyn Fn() + Send + 'static>,
    ) -> Result<()> {
        let stop = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
        let s = stop.clone();
        let thread =
            std::thread::Builder::new().name("forkfs-gc-acks".into()).spawn(move || {
                loop {
                    task();
                    let mut stopped = s.0.lock();
                    if !*stopped {
                        s.1.wait_for(&mut stopped, every);
                    }
                    if *stopped {
                        return;
                    }
                }
            })?;
        *self.ticker.lock() = Some(Ticker { stop, thread });
        Ok(())
    }

    /// How long uploads may make no progress before waiting for them fails.
    pub(crate) fn stall(&self) -> Duration {
        self.stall
    }

    pub(crate) fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    fn backend(&self) -> &Arc<Backend> {
        self.storage.chunks.backend()
    }

    fn db(&self) -> &Db {
        &self.storage.db
    }

    /// The right to write `vol` (its lease; fails if another host holds
    /// it). The publisher keeps the lease until the volume's head is out.
    ///
    /// The head to start from is this host's own when the lease was kept
    /// from an earlier open that compared the heads, and has not expired
    /// since (nobody else could write meanwhile, so the bucket need not be
    /// asked: a last version at a mount's end works with the bucket out of
    /// reach), else [`Remote::refresh_volume`]'s.
    pub(crate) fn right(
        self: &Arc<Self>,
        vol: &VolumeRecord,
    ) -> Result<(Arc<dyn Fence>, HeadRecord)> {
        let (lease, held) = self.publisher.lease(vol)?;
        let head = match held {
            publish::Held::Kept => self.storage.records.head(vol.id)?,
            publish::Held::Taken => {
                let head = self.refresh_volume(vol)?;
                lease.mark_reconciled();
                head
            }
        };
        Ok((Arc::new(Right { lease, _remote: self.clone() }), head))
    }

    /// A head changed in the local index: publish it soon.
    pub(crate) fn committed(&self) {
        self.publisher.committed();
    }

    /// Puts the head object of a new volume: the creation's commit point,
    /// after the objects it names, created only if absent. Adds to `b`
    /// that this host published it.
    pub(crate) fn create_head(
        &self,
        b: &mut Batch,
        vol: VolumeId,
        head: &HeadRecord,
    ) -> Result<()> {
        self.uploaded_so_far()?;
        let v = self
            .backend()
            .put_or_same(&keys::head(vol), records::encode(head)?, None)
            .map_err(|e| {
                if e.kind() == ErrorKind::Conflict {
                    Error::conflict(format!(
                        "volume id {} was taken by another host; try again",
                        vol.0
                    ))
                } else {
                    e
                }
            })?;
        self.publisher.saw(vol, Some(v));
        self.publisher.set_published(b, vol, head);
        self.bump();
        Ok(())
    }

    /// A volume was deleted: forget its head object.
    pub(crate) fn deleted(&self, vol: VolumeId) {
        self.publisher.saw(vol, None);
    }

    /// Held while no publishing pass may run (deleting a volume).
    pub(crate) fn pass_lock(&self) -> MutexGuard<'_, ()> {
        self.publisher.pass.lock()
    }

    /// Waits until every object put so far is in the object store (not
    /// only queued on local disk).
    pub(crate) fn uploaded_so_far(&self) -> Result<()> {
        match self.backend().outbox() {
            Some(o) => o.drain(self.stall),
            None => Ok(()),
        }
    }

    /// Waits until everything committed so far is in the object store:
    /// queued uploads, then the heads that name them. Fails (nothing is
    /// lost; it stays queued) once uploads make no progress for the read
    /// deadline.
    pub fn sync(&self) -> Result<()> {
        self.uploaded_so_far()?;
        self.publisher.publish(self.stall, true)
    }

    /// Volumes whose head another host advanced meanwhile.
    pub fn diverged(&self) -> Vec<VolumeId> {
        self.publisher.diverged()
    }

    /// Whether the object store holds this host's head of `vol`.
    pub fn is_published(&self, vol: VolumeId, head: &HeadRecord) -> Result<bool> {
        self.publisher.is_published(vol, head)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(t) = self.ticker.lock().take() {
            *t.stop.0.lock() = true;
            t.stop.1.notify_all();
            let _ = t.thread.join();
        }
        let p = &self.publisher;
        p.stop();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        // Closing: what this process committed goes to the object store
        // now (what cannot, stays queued for the next open).
        // A process that wrote nothing leaves an earlier backlog alone.
        let wrote = self.backend().outbox().is_some_and(|o| o.queued_here());
        if (wrote || p.committed_here())
            && let Err(e) = self.sync()
        {
            tracing::warn!(error = %e, "closing with uploads pending; they resume when the store is next opened");
        }
        p.release_all();
    }
}
