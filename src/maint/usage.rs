//! The quota count of fs volumes (`used` in the fs record): `fsck` walks
//! each head's committed tree and compares; `fsck --repair` recounts a
//! head whose count is wrong.

use crate::error::Result;
use crate::graph::SnapshotOptions;
use crate::head::fs::FsReader;
use crate::records::VolumeKind;
use crate::store::Store;

impl Store {
    /// One problem per fs volume whose committed head keeps a count of
    /// used bytes that its tree does not add up to. A tree that cannot be
    /// read is left to the walk that locates damage.
    pub(crate) fn check_usage(&self) -> Result<Vec<String>> {
        Ok(self.miscounted()?.into_iter().map(|(_, problem)| problem).collect())
    }

    /// The fs volumes [`Store::check_usage`] finds miscounted, with the problem.
    fn miscounted(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for vol in self.volumes().list()? {
            if vol.kind != VolumeKind::Fs {
                continue;
            }
            let Ok(head) = self.storage().records.head(vol.id) else { continue };
            let r = FsReader::frozen(&self.storage().chunks, head.root, vol.block_size);
            let Ok(Some(kept)) = r.meta().map(|m| m.used) else { continue };
            let Ok(counted) = r.count_used() else { continue };
            if kept != counted {
                let problem = format!(
                    "{} head: the quota count says {kept} bytes, the files take {counted} \
                     (fsck --repair recounts)",
                    vol.name
                );
                out.push((vol.name.to_string(), problem));
            }
        }
        Ok(out)
    }

    /// Recounts the used bytes of each fs volume [`Store::check_usage`]
    /// finds miscounted, and checkpoints it so the committed head has the
    /// new count; returns what it fixed, and what it could not (a volume
    /// another host holds, a tree that cannot be read) without failing
    /// the rest of the repair.
    pub(crate) fn repair_usage(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (name, _) in self.miscounted()? {
            let fixed = self.volumes().open_fs(&name).and_then(|head| {
                let changed = head.recount()?;
                let opts = SnapshotOptions {
                    label: Some("fsck --repair: quota count".into()),
                    ..Default::default()
                };
                self.graph().snapshot(&name, &opts)?;
                Ok(changed)
            });
            out.push(match fixed {
                Ok(Some((was, now))) => format!("{name}: quota count {was} -> {now} bytes"),
                Ok(None) => format!("{name}: quota count right in the live head"),
                Err(e) => format!("{name}: quota count not recounted: {e}"),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Posix;
    use crate::graph::SnapshotOptions;
    use crate::head::FsHead;
    use crate::head::fs::{FileKind, ROOT_INO};
    use crate::records::{VersionRecord, VolumeKind};
    use crate::store::{Store, StoreConfig};

    fn store() -> (tempfile::TempDir, Store, FsHead) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
        store.volumes().create("ws", VolumeKind::Fs, None, None).unwrap();
        let h = store.volumes().open_fs("ws").unwrap();
        for (name, len) in [("a", 10_000usize), ("b", 5000)] {
            let f = h.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, (0, 0), None);
            h.write_file(f.unwrap().ino, 0, &vec![1; len]).unwrap();
        }
        assert_eq!(h.used().unwrap(), 12_288 + 8192);
        (dir, store, h)
    }

    fn snapshot(s: &Store) -> VersionRecord {
        s.graph().snapshot("ws", &SnapshotOptions::default()).unwrap()
    }

    #[test]
    fn fsck_finds_a_wrong_count_and_repair_recounts_it() {
        let (_d, s, h) = store();
        snapshot(&s);
        assert!(s.check_usage().unwrap().is_empty());
        h.force_used(Some(999)).unwrap();
        snapshot(&s);
        let problems = s.check_usage().unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("says 999 bytes, the files take 20480"), "{problems:?}");
        let fixed = s.repair_usage().unwrap();
        assert_eq!(fixed, vec!["ws: quota count 999 -> 20480 bytes".to_string()]);
        assert_eq!(h.used().unwrap(), 20_480);
        // The repair is committed: fsck right after it finds nothing.
        assert!(s.check_usage().unwrap().is_empty());
        assert!(s.repair_usage().unwrap().is_empty());
    }

    #[test]
    fn a_volume_from_before_the_count_is_counted_when_it_needs_one() {
        let (_d, s, h) = store();
        h.force_used(None).unwrap();
        let old = snapshot(&s);
        // Without a count, nothing is kept and fsck has nothing to compare.
        let f = h.create(ROOT_INO, b"c", FileKind::File, 0o644, (0, 0), None).unwrap();
        h.write_file(f.ino, 0, &[2; 100]).unwrap();
        assert_eq!(h.used().unwrap(), 20_480 + 4096, "counted by a walk");
        assert!(s.check_usage().unwrap().is_empty());
        // A quota is enforced at once: its first change counts the tree,
        // and from then on every change keeps the count.
        let (_, used) = s.volumes().set_quota("ws", Some(1 << 20)).unwrap();
        assert_eq!(used, 20_480 + 4096);
        assert_eq!(h.reader().meta().unwrap().used, None, "set_quota opens and writes nothing");
        let big = h.write_file(f.ino, 0, &vec![4; 2 << 20]).unwrap_err();
        assert_eq!(big.posix_condition(), Some(Posix::NoSpace));
        h.write_file(f.ino, 4096, &[2; 100]).unwrap();
        assert_eq!(h.reader().meta().unwrap().used, Some(20_480 + 8192));
        // A restore to a version without a count, under a quota: the
        // first change counts it, as for any volume without one.
        s.graph().restore("ws", &old).unwrap();
        assert_eq!(h.used().unwrap(), 20_480);
        let d = h.create(ROOT_INO, b"d", FileKind::File, 0o644, (0, 0), None).unwrap();
        let past = h.write_file(d.ino, 0, &vec![3; 2 << 20]).unwrap_err();
        assert_eq!(past.posix_condition(), Some(Posix::NoSpace));
        h.write_file(d.ino, 0, &[3; 5000]).unwrap();
        assert_eq!(h.reader().meta().unwrap().used, Some(20_480 + 8192));
    }
}
