//! The exports a server offers, opened on first use and shared by
//! sessions. Live heads are kept while the server runs (one per volume,
//! with its persistence state); versions are kept in a bounded LRU keyed
//! by the resolved version id, so `vm1@~1`, `vm1@3f2a` and `vm1@nightly`
//! share one entry when they name the same version, and no spelling a
//! client makes up grows the server.

use crate::changed::ChangedCache;
use crate::export::Export;
use crate::persist::Mode;
use forkfs::{Store, Target, VersionId, VolumeKind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Version exports kept open (each holds its version's record and reader).
pub const VERSION_EXPORTS: usize = 64;

pub struct Exports {
    store: Store,
    only: Vec<String>,
    /// `--consistency`: per volume, and for all (`None`).
    modes: Vec<(Option<String>, Mode)>,
    /// Live heads by volume name.
    live: Mutex<HashMap<String, Arc<Export>>>,
    versions: quick_cache::sync::Cache<VersionId, Arc<Export>>,
    changed: Arc<ChangedCache>,
    /// `--allow-client VOL=FINGERPRINT`: a volume named here is served
    /// only to clients presenting one of its certificates.
    clients: Vec<(String, String)>,
}

impl Exports {
    pub fn new(store: Store, only: Vec<String>, modes: Vec<(Option<String>, Mode)>) -> Exports {
        let changed = Arc::new(ChangedCache::new(crate::changed::CAPACITY));
        let c = changed.clone();
        // A restore (through the control socket) replaces a head's content
        // without a write of ours.
        store.graph().on_restore(Arc::new(move |_| c.restored()));
        Exports {
            store,
            only,
            modes,
            live: Mutex::new(HashMap::new()),
            versions: quick_cache::sync::Cache::new(VERSION_EXPORTS),
            changed,
            clients: Vec::new(),
        }
    }

    /// Serves each volume of `rules` (volume, identity) only to clients
    /// whose certificate names one of its identities. A rule that names
    /// no block volume of the store is refused: a mistyped name would
    /// leave the volume it meant open to every client.
    pub fn with_clients(mut self, rules: Vec<(String, String)>) -> forkfs::Result<Exports> {
        let vols = self.store.volumes().list()?;
        for (v, _) in &rules {
            if !vols.iter().any(|r| r.name.as_str() == v && r.kind == VolumeKind::Block) {
                return Err(forkfs::Error::invalid(format!(
                    "--allow-client {v}=…: the store has no block volume {v:?}"
                )));
            }
        }
        self.clients = rules;
        Ok(self)
    }

    /// Whether the client `who` (its certificate's identity; `None`: no
    /// certificate) may use export `name` (VOL or VOL@VERSION); else why not.
    pub fn client_may(&self, name: &str, who: Option<&str>) -> Result<(), String> {
        let vol = volume_of(name);
        let mut rules = self.clients.iter().filter(|(v, _)| v == vol).peekable();
        if rules.peek().is_none() {
            return Ok(());
        }
        match who {
            Some(w) if rules.any(|(_, id)| id == w) => Ok(()),
            Some(w) => Err(format!("client {w:?} may not use {vol} (--allow-client)")),
            None => Err(format!("{vol} is served only to named clients (--allow-client)")),
        }
    }

    /// The mode of a live volume: its `--consistency VOL=MODE`, else
    /// `--consistency MODE`, else the volume's own setting.
    fn mode_of(&self, vol: &forkfs::VolumeRecord) -> Mode {
        let named = self.modes.iter().find(|(v, _)| v.as_deref() == Some(vol.name.as_str()));
        let all = || self.modes.iter().find(|(v, _)| v.is_none());
        named.or_else(all).map_or(vol.consistency.into(), |(_, m)| *m)
    }

    fn allowed(&self, name: &str) -> bool {
        let vol = volume_of(name);
        self.only.is_empty() || self.only.iter().any(|o| o == name || o == vol)
    }

    /// The store served.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Names for NBD_OPT_LIST: every block volume (or the configured ones)
    /// that the client `who` may use.
    pub fn list(&self, who: Option<&str>) -> forkfs::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for v in self.store.volumes().list()? {
            let name = v.name.as_str();
            if v.kind == VolumeKind::Block
                && self.allowed(name)
                && self.client_may(name, who).is_ok()
            {
                out.push((v.name.to_string(), format!("forkfs block volume, {} bytes", v.size)));
            }
        }
        Ok(out)
    }

    pub fn open(&self, name: &str) -> forkfs::Result<Arc<Export>> {
        if !self.allowed(name) {
            return Err(forkfs::Error::not_found(format!("export {name:?} is not served")));
        }
        match self.store.graph().resolve(name)? {
            Target::Version(v) => {
                let id = v.id;
                self.versions.get_or_insert_with(&id, || {
                    let t = Target::Version(v);
                    let mode = |r: &forkfs::VolumeRecord| self.mode_of(r);
                    Export::open(&self.store, name, t, mode, self.changed.clone()).map(Arc::new)
                })
            }
            Target::Head(v) => {
                // Held throughout: one Export (and one safe-point detector) per volume.
                let mut live = self.live.lock();
                if let Some(e) = live.get(v.name.as_str()) {
                    return Ok(e.clone());
                }
                let key = v.name.to_string();
                let mode = |r: &forkfs::VolumeRecord| self.mode_of(r);
                let e =
                    Export::open(&self.store, name, Target::Head(v), mode, self.changed.clone())?;
                let e = Arc::new(e);
                live.insert(key, e.clone());
                Ok(e)
            }
        }
    }

    /// Every live export opened so far, and the versions still cached.
    pub fn opened(&self) -> Vec<Arc<Export>> {
        let mut all: Vec<_> = self.live.lock().values().cloned().collect();
        all.extend(self.versions.iter().map(|(_, e)| e));
        all
    }

    /// Version exports held (for tests of the bound).
    #[cfg(test)]
    pub fn versions_held(&self) -> usize {
        self.versions.len()
    }
}

/// The volume an export name (VOL or VOL@VERSION) is of.
fn volume_of(name: &str) -> &str {
    name.split_once('@').map_or(name, |(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_one_entry_per_id_whatever_the_spelling_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("s"), forkfs::StoreConfig::default()).unwrap();
        store.volumes().create("disk", VolumeKind::Block, Some(1 << 20), None).unwrap();
        let mut ids = Vec::new();
        for i in 0..VERSION_EXPORTS + 6 {
            let opts =
                forkfs::SnapshotOptions { name: Some(format!("v{i}")), ..Default::default() };
            ids.push(store.graph().snapshot("disk", &opts).unwrap().id);
        }
        let exports = Exports::new(store, Vec::new(), Vec::new());
        let last = ids.last().unwrap().to_string();
        let n = ids.len();
        let spellings = [
            format!("disk@v{}", n - 1),
            format!("disk@{last}"),
            format!("disk@{}", &last[..8]),
            format!("disk@{}", &last[..20]),
            "disk@~0".to_string(),
        ];
        let first = exports.open(&spellings[0]).unwrap();
        for s in &spellings[1..] {
            assert!(Arc::ptr_eq(&first, &exports.open(s).unwrap()), "{s}");
        }
        assert_eq!(exports.versions_held(), 1);
        for i in 0..n {
            exports.open(&format!("disk@v{i}")).unwrap();
        }
        assert!(exports.versions_held() <= VERSION_EXPORTS, "{}", exports.versions_held());
        let live = exports.open("disk").unwrap();
        assert!(Arc::ptr_eq(&live, &exports.open("disk").unwrap()));
        assert!(!live.read_only && first.read_only);
    }
}
