//! Reads of a live fs volume while checkpoints commit beside them, as the
//! mount reads while its automatic versions are taken. A checkpoint
//! replaces the overlay with a new base in one commit; a read that began
//! before it and goes on after it must still see one state, never the
//! old base without the overlay that completed it (a file that is there
//! reported missing, or read as older bytes).

use forkfs::fs::{FileKind, ROOT_INO};
use forkfs::{SnapshotOptions, Store, StoreConfig, VolumeKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Round `n`'s bytes of the file: two 64 KiB blocks and a tail.
fn content(n: u64) -> Vec<u8> {
    (0..150_000u64).map(|j| (n * 13 + j / 1000) as u8 | 1).collect()
}

/// Which round each 64 KiB block of the file is of, looked for from
/// round `n` (where it most often is) on.
fn blocks_rounds(rounds: &[Vec<u8>], bytes: &[u8], n: u64) -> Vec<Option<u64>> {
    fn block(b: &[u8], k: usize) -> &[u8] {
        &b[k * 65536..((k + 1) * 65536).min(b.len())]
    }
    (0..bytes.len().div_ceil(65536))
        .map(|k| {
            let mut candidates = (n..=150u64).chain(0..n);
            candidates.find(|m| block(&rounds[*m as usize], k) == block(bytes, k))
        })
        .collect()
}

/// Sets its flag when dropped: the reader stops even if the writer fails.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn reads_beside_checkpoints_see_one_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap());
    store.volumes().create("ws", VolumeKind::Fs, None, None).unwrap();
    let h = store.volumes().open_fs("ws").unwrap();
    let f = h.create(ROOT_INO, b"f", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.write_file(f.ino, 0, &content(0)).unwrap();
    // Round n: directory d{n} made and the file rewritten with content(n),
    // both in the overlay, then a checkpoint folds them into the base.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, h, done, stop) = (store.clone(), h.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let _stop = SetOnDrop(stop);
            for n in 1..=150u64 {
                h.create(ROOT_INO, format!("d{n}").as_bytes(), FileKind::Dir, 0o755, (0, 0), None)
                    .unwrap();
                h.write_file(f.ino, 0, &content(n)).unwrap();
                done.store(n, Ordering::SeqCst);
                store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
            }
        })
    };
    let all: Vec<Vec<u8>> = (0..=150).map(content).collect();
    let (mut reads, mut problems) = (0u64, Vec::new());
    while !stop.load(Ordering::SeqCst) && problems.len() < 5 {
        let n = done.load(Ordering::SeqCst);
        if n == 0 {
            std::thread::yield_now();
            continue;
        }
        // Short reads between the long ones: most often across a commit.
        for _ in 0..20 {
            let name = format!("d{n}");
            match h.read(|r| r.lookup(&r.inode(ROOT_INO)?, name.as_bytes())) {
                Ok(Some(_)) => {}
                Ok(None) => problems.push(format!("after round {n}: {name} not found")),
                Err(e) => problems.push(format!("after round {n}: {name}: {e}")),
            }
        }
        let seen = h.read(|r| {
            let root = r.inode(ROOT_INO)?;
            let d = r.lookup(&root, format!("d{n}").as_bytes())?;
            let i = r.inode(f.ino)?;
            let mut buf = vec![0u8; i.size as usize];
            let got = r.read(&i, 0, &mut buf)?;
            buf.truncate(got);
            Ok((d.is_some(), buf))
        });
        reads += 1;
        match seen {
            Ok((true, bytes)) if bytes.len() == 150_000 => {
                // A read beside a write may see some blocks of each (as
                // on ext4), but never a block older than round n.
                let rounds = blocks_rounds(&all, &bytes, n);
                if rounds.iter().any(|m| m.is_none_or(|m| m < n)) {
                    problems.push(format!("after round {n}: blocks of rounds {rounds:?}"));
                }
            }
            Ok((found, bytes)) => problems.push(format!(
                "after round {n}: d{n} found {found}, file of {} bytes",
                bytes.len()
            )),
            Err(e) => problems.push(format!("after round {n}: {e}")),
        }
    }
    writer.join().expect("the writer failed");
    assert!(problems.is_empty(), "{reads} reads, wrong ones:\n{}", problems.join("\n"));
    // Each round reads 20 names and the file: a test that read next to
    // nothing would prove nothing.
    assert!(reads >= 30, "only {reads} long reads beside 150 checkpoints");
}
