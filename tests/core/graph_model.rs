//! Model-based property test of the version graph: random sequences of
//! writes, snapshots, forks, restores, tags, deletions, prunes and garbage
//! collections against a model of plain byte vectors. After every GC every
//! live version and head must read back exactly; after a final GC no pack
//! may hold only garbage.

use forkfs::GcOptions;
use forkfs::Policy;
use forkfs::Quiet;
use forkfs::now_ms;
use forkfs::{Origin, SnapshotOptions, Store, StoreConfig, Target, VersionId, VolumeKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::time::Duration;

const SIZE: usize = 2 << 20;
const BS: u32 = 4096;

#[derive(Debug, Clone)]
enum Op {
    Write { vol: usize, off: usize, len: usize, byte: u8 },
    Zero { vol: usize, off: usize, len: usize },
    Snapshot { vol: usize, named: bool, auto: bool },
    Fork { version: usize },
    Restore { vol: usize, version: usize },
    DeleteVersion { version: usize },
    Prune { vol: usize, keep: usize },
    Gc { compact: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, 0..SIZE, 1..20_000usize, any::<u8>()).prop_map(|(vol, off, len, byte)| Op::Write { vol, off, len, byte }),
        1 => (0..4usize, 0..SIZE, 1..40_000usize).prop_map(|(vol, off, len)| Op::Zero { vol, off, len }),
        // Large enough for range tombstones (256+ whole blocks).
        1 => (0..4usize, 0..SIZE / 2, (SIZE / 2)..SIZE).prop_map(|(vol, off, len)| Op::Zero { vol, off, len }),
        3 => (0..4usize, any::<bool>(), any::<bool>()).prop_map(|(vol, named, auto)| Op::Snapshot { vol, named, auto }),
        1 => (0..64usize).prop_map(|version| Op::Fork { version }),
        1 => (0..4usize, 0..64usize).prop_map(|(vol, version)| Op::Restore { vol, version }),
        1 => (0..64usize).prop_map(|version| Op::DeleteVersion { version }),
        1 => (0..4usize, 0..3usize).prop_map(|(vol, keep)| Op::Prune { vol, keep }),
        1 => any::<bool>().prop_map(|compact| Op::Gc { compact }),
    ]
}

fn gc(store: &Store, compact: bool) -> forkfs::GcReport {
    let opts = GcOptions {
        dry_run: false,
        grace: Duration::ZERO,
        compact_below: if compact { 0.9 } else { 0.0 },
        ..Default::default()
    };
    store.gc(&opts, &Quiet).unwrap()
}

fn verify(store: &Store, m: &Model) -> Result<(), TestCaseError> {
    for (name, data) in &m.heads {
        let t = store.graph().resolve(name).unwrap();
        prop_assert!(read_all(store, &t) == *data, "head of {} differs", name);
    }
    for (id, vol, data) in &m.versions {
        let t = store.graph().resolve(&format!("{vol}@{id}")).unwrap();
        prop_assert!(read_all(store, &t) == *data, "version {} differs", id);
    }
    Ok(())
}

struct Model {
    heads: Vec<(String, Vec<u8>)>,
    versions: Vec<(VersionId, String, Vec<u8>)>,
}

/// The whole volume, read into a buffer; and read again as pieces over
/// unaligned spans (the NBD server's path), which must agree.
fn read_all(store: &Store, t: &Target) -> Vec<u8> {
    let mut buf = vec![0u8; SIZE];
    // (offset, length): unaligned, covering every byte once.
    let end = SIZE as u64;
    let spans = [(0, 4097), (4097, 95_906), (100_003, end - 100_004), (end - 1, 1)];
    let mut pieces = Vec::new();
    match t {
        Target::Head(v) => {
            let head = store.volumes().open_block(v.name.as_str()).unwrap();
            head.read_at(0, &mut buf).unwrap();
            for (at, len) in spans {
                pieces.extend(head.read_pieces(at, len).unwrap());
            }
        }
        Target::Version(v) => {
            let frozen = store.graph().frozen(v).unwrap();
            frozen.read_at(0, &mut buf).unwrap();
            for (at, len) in spans {
                pieces.extend(frozen.read_pieces(at, len).unwrap());
            }
        }
    }
    let mut joined = Vec::with_capacity(SIZE);
    for p in pieces {
        match p {
            forkfs::Piece::Bytes(b) => joined.extend_from_slice(&b),
            forkfs::Piece::Zeros(n) => joined.resize(joined.len() + n, 0),
        }
    }
    assert!(joined == buf, "read as pieces, {t:?} differs from its plain read");
    buf
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn version_graph_matches_model(ops in prop::collection::vec(op(), 1..50)) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig { pack_target: 64 << 10, default_block_size: BS, ..StoreConfig::default() };
        let store = Store::init(dir.path(), cfg).unwrap();
        store.volumes().create("v0", VolumeKind::Block, Some(SIZE as u64), None).unwrap();
        let mut m = Model { heads: vec![("v0".into(), vec![0u8; SIZE])], versions: Vec::new() };
        let mut names = 0;
        for op in ops {
            match op {
                Op::Write { vol, off, len, byte } => {
                    let n = m.heads.len();
                    let (name, data) = &mut m.heads[vol % n];
                    let len = len.min(SIZE - off);
                    let buf: Vec<u8> = (0..len).map(|i| byte ^ (i as u8)).collect();
                    store.volumes().open_block(name).unwrap().write_at(off as u64, &buf).unwrap();
                    data[off..off + len].copy_from_slice(&buf);
                }
                Op::Zero { vol, off, len } => {
                    let n = m.heads.len();
                    let (name, data) = &mut m.heads[vol % n];
                    let len = len.min(SIZE - off);
                    store.volumes().open_block(name).unwrap().write_zeroes(off as u64, len as u64).unwrap();
                    data[off..off + len].fill(0);
                }
                Op::Snapshot { vol, named, auto } => {
                    let (name, data) = &m.heads[vol % m.heads.len()];
                    names += 1;
                    let opts = SnapshotOptions {
                        name: named.then(|| format!("n{names}")),
                        origin: auto.then_some(Origin::Auto),
                        ..Default::default()
                    };
                    let v = store.graph().snapshot(name, &opts).unwrap();
                    m.versions.push((v.id, name.clone(), data.clone()));
                }
                Op::Fork { version } if !m.versions.is_empty() => {
                    let (id, vol, data) = m.versions[version % m.versions.len()].clone();
                    let rec = store.graph().version(&id).unwrap();
                    let new = format!("v{}", m.heads.len());
                    prop_assert_eq!(rec.volume_name.as_str(), vol.as_str());
                    store.graph().fork(&rec, &new).unwrap();
                    m.heads.push((new, data));
                }
                Op::Restore { vol, version } if !m.versions.is_empty() => {
                    let (id, _, data) = m.versions[version % m.versions.len()].clone();
                    let idx = vol % m.heads.len();
                    let name = m.heads[idx].0.clone();
                    let pre = store.graph().restore(&name, &store.graph().version(&id).unwrap()).unwrap();
                    // Restore is undoable: the old head became a version.
                    m.versions.push((pre.id, name.clone(), m.heads[idx].1.clone()));
                    m.heads[idx].1 = data;
                }
                Op::DeleteVersion { version } if !m.versions.is_empty() => {
                    let (id, _, _) = m.versions.remove(version % m.versions.len());
                    store.graph().delete_version(&store.graph().version(&id).unwrap()).unwrap();
                    prop_assert!(store.graph().version(&id).is_err());
                }
                Op::Prune { vol, keep } => {
                    let name = m.heads[vol % m.heads.len()].0.clone();
                    let policy = Policy { keep_recent: keep, unit_ms: 1, per_bucket: 1 };
                    for v in store.graph().prune(&name, &policy, now_ms() + (1 << 20), false).unwrap() {
                        let i = m.versions.iter().position(|x| x.0 == v.id);
                        prop_assert!(i.is_some(), "prune removed {} the model lacks", v.id);
                        m.versions.remove(i.unwrap());
                    }
                }
                Op::Gc { compact } => {
                    gc(&store, compact);
                    verify(&store, &m)?;
                }
                _ => {}
            }
        }
        verify(&store, &m)?;
        // A final GC leaves no pack without a live chunk and none under its
        // compaction threshold: a second one at the same threshold finds nothing.
        gc(&store, true);
        let again = store.gc(&GcOptions { dry_run: true, grace: Duration::ZERO, compact_below: 0.9, ..Default::default() }, &Quiet).unwrap();
        prop_assert_eq!((again.packs_deleted, again.packs_compacted, again.orphans_deleted), (0, 0, 0), "{:?}", again);
        verify(&store, &m)?;
        // Every version of the log is one the model knows, in order.
        for (name, _) in &m.heads {
            let log = store.graph().log(&store.volumes().get(name).unwrap()).unwrap();
            let ids: Vec<VersionId> = m.versions.iter().filter(|v| &v.1 == name).map(|v| v.0).collect();
            prop_assert_eq!(log.iter().map(|v| v.id).collect::<Vec<_>>(), ids);
        }
        let report = store.check().unwrap();
        prop_assert!(report.ok(), "check found problems: {:?}", report.problems);
        // Everything survives a reopen.
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        for (id, vol, data) in &m.versions {
            let t = store.graph().resolve(&format!("{vol}@{id}")).unwrap();
            prop_assert!(read_all(&store, &t) == *data);
        }
    }
}

/// One write of data blocks around a zero block, with partial blocks at
/// both ends (the whole blocks in a row go to the data log in one
/// write): the head, its snapshot and the head after a reopen read it back.
#[test]
fn a_write_of_runs_split_by_a_zero_block_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { default_block_size: BS, ..StoreConfig::default() };
    let store = Store::init(dir.path(), cfg).unwrap();
    store.volumes().create("v", VolumeKind::Block, Some(SIZE as u64), None).unwrap();
    let bs = BS as usize;
    let mut buf: Vec<u8> = (0..7 * bs + 300).map(|i| (i % 251) as u8 | 1).collect();
    let at = bs as u64 - 100;
    // Block 4 of the volume, whole: it splits the run of blocks 1 to 7.
    buf[(3 * bs + 100)..(4 * bs + 100)].fill(0);
    let mut want = vec![0u8; SIZE];
    want[at as usize..at as usize + buf.len()].copy_from_slice(&buf);
    let head = store.volumes().open_block("v").unwrap();
    head.write_at(at, &buf).unwrap();
    assert_eq!(head.allocated_blocks().unwrap(), [0, 1, 2, 3, 5, 6, 7, 8], "block 4 is a hole");
    let t = store.graph().resolve("v").unwrap();
    assert!(read_all(&store, &t) == want, "the head differs");
    let v = store.graph().snapshot("v", &SnapshotOptions::default()).unwrap();
    let version = store.graph().resolve(&format!("v@{}", v.id)).unwrap();
    assert!(read_all(&store, &version) == want, "the version differs");
    drop(head);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let t = store.graph().resolve("v").unwrap();
    assert!(read_all(&store, &t) == want, "the head differs after a reopen");
}
