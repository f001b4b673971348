//! Single writer across hosts: the lease of a volume in a remote store.
//!
//! Every host of a remote store has its own local index, so nothing local
//! stops two hosts from writing the same volume. The lease does: an object
//! `leases/<volume>.json` naming the holder and an expiry, created with a
//! conditional put (create-if-absent) and renewed, or taken over once
//! expired, with a conditional update naming the version read. A second
//! writer gets a clear error naming the holder; a crashed holder's lease
//! expires and the next host takes it over, starting from the last head
//! committed to the remote. Heads themselves are advanced with a
//! conditional update too, so even a holder that lost its lease without
//! noticing cannot move a head another host advanced.
//!
//! A holder renews at a third of the term. One that cannot reach the
//! object store goes on writing to local disk (its uploads and head
//! publishes wait in the outbox) and keeps retrying: a renewal names the
//! lease version this host last wrote, so it succeeds only if no other host
//! took the lease meanwhile. If one did, the renewal is a conflict and the
//! volume's writes fail from then on; versions this host committed while
//! cut off stay in its local history but never become the remote head
//! (the head update is conditional too), and `forkfs status` reports the
//! volume diverged. Read-only access to versions never needs a lease.
//! Stores whose objects are local files (the embedded default, `file://`)
//! have no conditional updates and take no leases: one process opens a
//! store directory at a time anyway.

use crate::clock::now_ms;
use crate::error::{Error, ErrorKind, Result};
use crate::objects::{Backend, keys};
use crate::records::VolumeRecord;
use bytes::Bytes;
use object_store::UpdateVersion;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Unique per acquisition: host, pid and a random tag.
    pub holder: String,
    pub host: String,
    pub pid: u32,
    pub acquired_ms: u64,
    pub expires_ms: u64,
}

struct Shared {
    backend: Arc<Backend>,
    key: object_store::path::Path,
    volume: String,
    term: Duration,
    state: Mutex<(LeaseRecord, UpdateVersion)>,
    lost: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// A held lease; renewed in the background, released on drop.
pub struct Lease {
    shared: Arc<Shared>,
    renewer: Option<std::thread::JoinHandle<()>>,
    /// This host's head was compared with the bucket's under this lease.
    reconciled: AtomicBool,
}

fn encode(r: &LeaseRecord) -> Result<Bytes> {
    Ok(Bytes::from(serde_json::to_vec_pretty(r)?))
}

impl Lease {
    /// Takes the lease of `vol`, or fails with a conflict naming the holder.
    pub fn acquire(backend: Arc<Backend>, vol: &VolumeRecord, term: Duration) -> Result<Lease> {
        let key = keys::lease(vol.id);
        let host = crate::clock::hostname();
        let pid = std::process::id();
        let now = now_ms();
        let mine = LeaseRecord {
            holder: format!("{host}:{pid}:{:08x}", rand::random::<u32>()),
            host,
            pid,
            acquired_ms: now,
            expires_ms: now + term.as_millis() as u64,
        };
        let expected = match backend.get_versioned(&key)? {
            None => None,
            Some((raw, version)) => {
                let theirs: LeaseRecord = serde_json::from_slice(&raw)
                    .map_err(|e| Error::corrupt(format!("lease of {}: {e}", vol.name)))?;
                if theirs.expires_ms > now {
                    return Err(held_by(vol.name.as_str(), &theirs));
                }
                if theirs.expires_ms > 0 {
                    tracing::warn!(volume = %vol.name, holder = %theirs.holder, "taking over an expired lease");
                }
                Some(version)
            }
        };
        let version = put_or_confirm(&backend, &key, &mine, expected).map_err(|e| {
            if e.kind() == ErrorKind::Conflict {
                Error::conflict(format!(
                    "volume {} was leased by another host at the same moment; try again",
                    vol.name
                ))
            } else {
                e
            }
        })?;
        let shared = Arc::new(Shared {
            backend,
            key,
            volume: vol.name.to_string(),
            term,
            state: Mutex::new((mine, version)),
            lost: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let renewer = std::thread::Builder::new()
            .name("forkfs-lease".into())
            .spawn(move || renew_loop(&s))?;
        Ok(Lease { shared, renewer: Some(renewer), reconciled: AtomicBool::new(false) })
    }

    /// Renews the lease now, so that what the caller does next (advance
    /// the head object) happens under a lease known to be this host's: a
    /// conflict means another host took it (the lease is lost from then on).
    pub fn confirm(&self) -> Result<()> {
        self.check()?;
        renew(&self.shared)?;
        Ok(())
    }

    /// Whether, by this host's clock, the lease has not expired since its
    /// last renewal (renewals that cannot reach the bucket let it run out).
    pub fn unexpired(&self) -> bool {
        now_ms() < self.shared.state.lock().0.expires_ms
    }

    /// Records that this host's head was compared with the bucket's under
    /// this lease (see [`Lease::reconciled`]).
    pub fn mark_reconciled(&self) {
        self.reconciled.store(true, Ordering::SeqCst);
    }

    /// Whether this host's head was compared with the bucket's under this
    /// lease: then, while it is unexpired, no other host can have advanced
    /// the volume since.
    pub fn reconciled(&self) -> bool {
        self.reconciled.load(Ordering::SeqCst)
    }

    /// Fails once another host has taken the lease.
    pub fn check(&self) -> Result<()> {
        if self.shared.lost.load(Ordering::SeqCst) {
            return Err(Error::conflict(format!(
                "the lease of volume {} was taken by another host after it expired; reopen the volume",
                self.shared.volume
            )));
        }
        Ok(())
    }
}

/// A conditional put of `rec` (see [`Backend::put_or_same`]).
fn put_or_confirm(
    backend: &Backend,
    key: &object_store::path::Path,
    rec: &LeaseRecord,
    expected: Option<UpdateVersion>,
) -> Result<UpdateVersion> {
    backend.put_or_same(key, encode(rec)?, expected)
}

/// Extends the lease by a term, naming the version this host last wrote:
/// a conflict means another host took it, and marks it lost. The state
/// lock is held across the put, so the loop and a `confirm` never race
/// with the same version (the loser would read a conflict).
fn renew(s: &Shared) -> Result<()> {
    let mut state = s.state.lock();
    let mut rec = state.0.clone();
    rec.expires_ms = now_ms() + s.term.as_millis() as u64;
    match put_or_confirm(&s.backend, &s.key, &rec, Some(state.1.clone())) {
        Ok(v) => {
            *state = (rec, v);
            Ok(())
        }
        Err(e) => {
            if e.kind() == ErrorKind::Conflict {
                s.lost.store(true, Ordering::SeqCst);
            }
            Err(e)
        }
    }
}

fn held_by(volume: &str, r: &LeaseRecord) -> Error {
    let left = r.expires_ms.saturating_sub(now_ms()) / 1000;
    Error::conflict(format!(
        "volume {volume} is being written by {} (pid {}, lease {}; expires in {left} s unless renewed)",
        r.host, r.pid, r.holder
    ))
}

fn renew_loop(s: &Shared) {
    loop {
        {
            let mut stop = s.stop.lock();
            if !*stop {
                s.wake.wait_for(&mut stop, s.term / 3);
            }
            if *stop {
                return;
            }
        }
        match renew(s) {
            Ok(()) => {}
            // Another host took it: this one stops writing the volume.
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::error!(volume = %s.volume, error = %e, "lease lost to another host");
                return;
            }
            // The object store is out of reach: writes go on to local disk
            // (uploads wait in the outbox). Renewal naming the version this
            // host last wrote succeeds only if no host took the lease
            // meanwhile; if one did, the next attempt is a conflict.
            Err(e) => {
                let expired = s.state.lock().0.expires_ms <= now_ms();
                tracing::error!(volume = %s.volume, error = %e, expired, "lease renewal failed; retrying");
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
        if self.shared.lost.load(Ordering::SeqCst) {
            return;
        }
        // Released by expiring it now, conditionally: never touch a lease
        // someone else took over.
        let (mut rec, version) = self.shared.state.lock().clone();
        rec.expires_ms = 0;
        if let Err(e) = put_or_confirm(&self.shared.backend, &self.shared.key, &rec, Some(version))
        {
            tracing::warn!(volume = %self.shared.volume, error = %e, "releasing the lease failed; it expires by itself");
        }
    }
}
