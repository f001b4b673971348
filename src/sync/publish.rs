//! Publishing heads to a remote object store, behind the outbox.
//!
//! A checkpoint or restore commits to the local index at once; the head
//! object other hosts read follows in the background, once every object the
//! new head names is uploaded (see `outbox.rs`). Each host remembers the
//! head it last published or took from the object store (`published/` in
//! the index): a head object that still holds it is this host's to
//! advance, with a conditional put naming the object's version (ETag), so
//! two hosts can never both advance a volume. A head object that holds
//! anything else was advanced by another host (after this one lost its
//! lease): this host's later versions stay local, and the volume is
//! reported diverged.
//!
//! A head is published only under the volume's lease, confirmed by a
//! renewal just before the put. The publisher keeps every lease this
//! process takes (a volume opened for writing shares it) until that
//! volume's head is published, so a command that ends, or a head that
//! closes, does not hand the volume to another host before its last
//! version is out; a head an earlier process left unpublished waits for
//! its lease to be free.

use super::lease::Lease;
use crate::db::Db;
use crate::error::{Error, ErrorKind, Result};
use crate::id::VolumeId;
use crate::objects::{self, Backend};
use crate::records::{HeadRecord, Records, VolumeRecord, keys};
use bytes::Bytes;
use object_store::UpdateVersion;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub struct Publisher {
    backend: Arc<Backend>,
    db: Arc<Db>,
    records: Records,
    /// The term of the leases it takes.
    lease_ttl: Duration,
    /// The version of each head object as this host last read or wrote it.
    etags: Mutex<HashMap<VolumeId, UpdateVersion>>,
    /// Volumes another host advanced under this one.
    diverged: Mutex<HashSet<VolumeId>>,
    /// One publishing pass at a time (and volume deletion waits for it).
    pub(crate) pass: Mutex<()>,
    /// The leases this process holds, kept until their heads are out.
    leases: Mutex<HashMap<VolumeId, Arc<Lease>>>,
    /// A head was committed in this process (closing then publishes).
    committed: std::sync::atomic::AtomicBool,
    stopping: std::sync::atomic::AtomicBool,
    kick: Mutex<(bool, bool)>,
    woken: Condvar,
}

/// How this process came to hold a volume's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Held since an earlier open compared this host's head with the
    /// bucket's, and unexpired by this host's clock: no other host can
    /// have advanced the volume meanwhile.
    Kept,
    /// Taken now, or held without that assurance (expired by this host's
    /// clock while renewals failed, or taken by the publisher for a head
    /// it had to publish): another host may have advanced the volume.
    Taken,
}

/// What became of one volume in a pass.
enum Done {
    Published,
    /// Another host holds the lease (this head waits for it).
    Waiting(String),
    Diverged,
}

/// What became of one head object's update.
enum Outcome {
    Published,
    Diverged(Option<HeadRecord>),
}

impl Publisher {
    pub fn new(
        backend: Arc<Backend>,
        records: Records,
        db: Arc<Db>,
        lease_ttl: Duration,
    ) -> Publisher {
        Publisher {
            backend,
            db,
            records,
            lease_ttl,
            etags: Mutex::new(HashMap::new()),
            diverged: Mutex::new(HashSet::new()),
            pass: Mutex::new(()),
            leases: Mutex::new(HashMap::new()),
            committed: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            kick: Mutex::new((false, false)),
            woken: Condvar::new(),
        }
    }

    /// Runs passes in the background until [`Publisher::stop`].
    pub fn spawn(self: &Arc<Self>) -> Result<std::thread::JoinHandle<()>> {
        let p = self.clone();
        Ok(std::thread::Builder::new().name("forkfs-publish".into()).spawn(move || {
            loop {
                {
                    let mut k = p.kick.lock();
                    if !k.0 && !k.1 {
                        p.woken.wait_for(&mut k, Duration::from_secs(5));
                    }
                    if k.1 {
                        return;
                    }
                    k.0 = false;
                }
                // In the background: no retry is hurried, and a long stall
                // (an outage) ends the pass; the next one tries again.
                if let Err(e) = p.publish(Duration::from_secs(60), false) {
                    tracing::debug!(error = %e, "heads not published yet");
                }
                p.release_published();
            }
        })?)
    }

    /// Publish soon (heads an earlier process left).
    pub fn kick(&self) {
        self.kick.lock().0 = true;
        self.woken.notify_all();
    }

    /// A head changed in this process: publish it soon, and before the
    /// store closes.
    pub fn committed(&self) {
        self.committed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.kick();
    }

    /// Whether this process committed a head (closing must publish).
    pub fn committed_here(&self) -> bool {
        self.committed.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn stop(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        self.kick.lock().1 = true;
        self.woken.notify_all();
    }

    /// The lease of `vol`: the one this process holds, else a new one
    /// (fails if another host holds it).
    pub fn lease(&self, vol: &VolumeRecord) -> Result<(Arc<Lease>, Held)> {
        let mut leases = self.leases.lock();
        if let Some(l) = leases.get(&vol.id)
            && l.check().is_ok()
        {
            let kept = l.unexpired() && l.reconciled();
            return Ok((l.clone(), if kept { Held::Kept } else { Held::Taken }));
        }
        let l = Arc::new(Lease::acquire(self.backend.clone(), vol, self.lease_ttl)?);
        leases.insert(vol.id, l.clone());
        Ok((l, Held::Taken))
    }

    /// Lets go of the leases nothing else uses whose heads are published
    /// (or that were lost).
    fn release_published(&self) {
        let mut gone = Vec::new();
        {
            let mut leases = self.leases.lock();
            leases.retain(|vol, l| {
                let due = self.due(*vol).unwrap_or(true);
                let lost = l.check().is_err();
                if lost && due {
                    // Taken over before this head was out.
                    self.diverged.lock().insert(*vol);
                }
                let unused = Arc::strong_count(l) == 1;
                let diverged = self.diverged.lock().contains(vol);
                let done = lost || (unused && (!due || diverged));
                if done {
                    gone.push(l.clone());
                }
                !done
            });
        }
        drop(gone); // releasing talks to the object store: not under the lock
    }

    /// Releases every lease (the store is closing).
    pub fn release_all(&self) {
        let all: Vec<_> = self.leases.lock().drain().collect();
        drop(all);
    }

    /// Whether the local head of `vol` is not yet published.
    fn due(&self, vol: VolumeId) -> Result<bool> {
        let Some(local) = self.db.get_json::<HeadRecord>(&keys::head(vol))? else {
            return Ok(false);
        };
        Ok(!self.is_published(vol, &local)?)
    }

    /// Whether the object store holds `head` for `vol`, as far as this
    /// host published or took it.
    pub fn is_published(&self, vol: VolumeId, head: &HeadRecord) -> Result<bool> {
        Ok(self.published(vol)?.as_ref() == Some(head))
    }

    /// Remembers the head object's version as just read (a lease taken,
    /// a head refreshed from the object store).
    pub fn saw(&self, vol: VolumeId, version: Option<UpdateVersion>) {
        let mut e = self.etags.lock();
        match version {
            Some(v) => e.insert(vol, v),
            None => e.remove(&vol),
        };
        self.diverged.lock().remove(&vol);
    }

    /// Volumes whose head another host advanced meanwhile.
    pub fn diverged(&self) -> Vec<VolumeId> {
        self.diverged.lock().iter().copied().collect()
    }

    /// The head this host last published or took for `vol`.
    pub fn published(&self, vol: VolumeId) -> Result<Option<HeadRecord>> {
        self.db.get_json(&keys::published(vol))
    }

    /// Records that the object store holds `head` for `vol`.
    pub fn set_published(&self, b: &mut rocksdb::WriteBatch, vol: VolumeId, head: &HeadRecord) {
        let raw = serde_json::to_vec(head).expect("a head record serializes");
        self.db.put_meta(b, &keys::published(vol), raw);
    }

    /// Publishes every local head the object store does not hold yet, once
    /// the objects it names are uploaded. Fails if uploads stall for
    /// `stall` (nothing is lost: the next pass tries again); `hurry`
    /// retries backing-off uploads at once (somebody waits).
    pub fn publish(&self, stall: Duration, hurry: bool) -> Result<()> {
        let _one = self.pass.lock();
        let (mut due, mut left) = (Vec::new(), Vec::new());
        for vol in self.records.volumes()? {
            let Some(local) = self.db.get_json::<HeadRecord>(&keys::head(vol.id))? else {
                continue;
            };
            let published = self.published(vol.id)?;
            if published.as_ref() == Some(&local) {
                continue;
            }
            if self.diverged.lock().contains(&vol.id) {
                left.push(format!("{} (diverged: another host took it over)", vol.name));
                continue;
            }
            due.push((vol, local, published));
        }
        let unpublished = |left: Vec<String>| {
            if !hurry || left.is_empty() {
                return Ok(());
            }
            Err(Error::conflict(format!("heads not published: {}", left.join(", "))))
        };
        if due.is_empty() {
            return unpublished(left);
        }
        // Read after the heads: everything they name was queued before.
        if let Some(o) = self.backend.outbox() {
            let stopping = || self.stopping.load(std::sync::atomic::Ordering::SeqCst) && !hurry;
            o.wait_through(o.tail(), stall, hurry, &stopping)?;
        }
        let mut first_error = None;
        let mut any = false;
        for (vol, local, published) in due {
            match self.publish_volume(&vol, &local, published.as_ref()) {
                Ok(Done::Published) => any = true,
                Ok(Done::Waiting(why)) => left.push(format!("{} ({why})", vol.name)),
                Ok(Done::Diverged) => {
                    left.push(format!("{} (diverged: another host took it over)", vol.name))
                }
                Err(e) => {
                    tracing::warn!(volume = %vol.name, error = %e, "head not published");
                    first_error.get_or_insert(e);
                }
            }
        }
        if any {
            super::view::bump(&self.backend);
        }
        match first_error {
            Some(e) => Err(e),
            None => unpublished(left),
        }
    }

    fn publish_volume(
        &self,
        vol: &VolumeRecord,
        local: &HeadRecord,
        published: Option<&HeadRecord>,
    ) -> Result<Done> {
        // Only under the volume's lease, renewed just now. A lease this
        // process held and lost (another host took the volume over before
        // this head was out) fails the renewal as a conflict.
        let held = self.leases.lock().get(&vol.id).cloned();
        let lease = match held.map_or_else(|| self.lease(vol).map(|(l, _)| l), Ok) {
            Ok(l) => l,
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::debug!(volume = %vol.name, error = %e, "head waits for the volume's lease");
                return Ok(Done::Waiting(e.to_string()));
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = lease.confirm() {
            if e.kind() == ErrorKind::Conflict {
                self.diverge(vol, local, None);
                return Ok(Done::Diverged);
            }
            return Err(e);
        }
        match self.publish_one(vol, local, published)? {
            Outcome::Published => {
                let mut b = rocksdb::WriteBatch::default();
                self.set_published(&mut b, vol.id, local);
                self.db.write(b, true)?;
                tracing::debug!(volume = %vol.name, base = ?local.base, "head published");
                Ok(Done::Published)
            }
            Outcome::Diverged(theirs) => {
                self.diverge(vol, local, theirs);
                Ok(Done::Diverged)
            }
        }
    }

    fn diverge(&self, vol: &VolumeRecord, local: &HeadRecord, theirs: Option<HeadRecord>) {
        tracing::error!(
            volume = %vol.name,
            theirs = ?theirs.map(|t| t.base),
            ours = ?local.base,
            "another host took this volume over; this host's later versions stay local and are not published"
        );
        self.diverged.lock().insert(vol.id);
    }

    fn publish_one(
        &self,
        vol: &VolumeRecord,
        local: &HeadRecord,
        published: Option<&HeadRecord>,
    ) -> Result<Outcome> {
        let key = objects::keys::head(vol.id);
        let obj = Bytes::from(serde_json::to_vec_pretty(local)?);
        let cached = self.etags.lock().get(&vol.id).cloned();
        // The version to replace: the cached one, else the object's if it
        // still holds what this host published (None: create it).
        let mut expected = match (published, cached) {
            (None, _) => None,
            (Some(_), Some(v)) => Some(v),
            (Some(_), None) => match self.check_remote(&key, local, published)? {
                Found::Ours(v) => return Ok(self.done(vol.id, v)),
                Found::Replace(v) => v,
                Found::Theirs(t) => return Ok(Outcome::Diverged(t)),
            },
        };
        for _ in 0..3 {
            match self.backend.put_conditional(&key, obj.clone(), expected.clone()) {
                Ok(v) => return Ok(self.done(vol.id, v)),
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    match self.check_remote(&key, local, published)? {
                        // Our own put, retried after its answer was lost.
                        Found::Ours(v) => return Ok(self.done(vol.id, v)),
                        // Still ours; only the cached version was stale.
                        Found::Replace(v) => expected = v,
                        Found::Theirs(t) => return Ok(Outcome::Diverged(t)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("{key}: conditional updates keep failing")))
    }

    /// What the head object holds, against this host's heads.
    fn check_remote(
        &self,
        key: &object_store::path::Path,
        local: &HeadRecord,
        published: Option<&HeadRecord>,
    ) -> Result<Found> {
        let Some((raw, v)) = self.backend.get_versioned(key)? else {
            return Ok(match published {
                None => Found::Replace(None),
                // Deleted by another host.
                Some(_) => Found::Theirs(None),
            });
        };
        let theirs: Option<HeadRecord> = serde_json::from_slice(&raw).ok();
        Ok(match theirs {
            Some(t) if t == *local => Found::Ours(v),
            Some(t) if Some(&t) == published => Found::Replace(Some(v)),
            t => Found::Theirs(t),
        })
    }

    fn done(&self, vol: VolumeId, v: UpdateVersion) -> Outcome {
        self.etags.lock().insert(vol, v);
        Outcome::Published
    }
}

/// A head object as [`Publisher::check_remote`] found it.
enum Found {
    /// It holds the local head already (at this version).
    Ours(UpdateVersion),
    /// It holds what this host published: replace it (None: create it).
    Replace(Option<UpdateVersion>),
    /// Another host wrote (or deleted) it.
    Theirs(Option<HeadRecord>),
}
