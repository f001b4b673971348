//! The rows of the corruption matrix: damage on disk, then reads, fsck,
//! gc and `fsck --repair` through the real binaries.

use super::Want::{Dropped, Fails, Img};
use super::{BS, Fixture, Want, files_under, flip, flip_middle, truncate_half};
use crate::common::forkfs;

/// How `fsck --repair` must end.
struct Repair {
    /// fsck passes afterwards.
    clean: bool,
    /// What each target reads afterwards.
    reads: [Want; 3],
    /// A list in the repair report that must name what was done ("" for
    /// a rebuilt index, whose report is the log).
    did: &'static str,
}

struct Row {
    name: &'static str,
    damage: fn(&Fixture),
    /// What each target (first, second, head) reads once damaged.
    reads: [Want; 3],
    fsck_flags: &'static [&'static str],
    /// What fsck's findings must contain; "" for damage that loses
    /// nothing, where fsck must pass.
    names: &'static str,
    repair: Repair,
}

/// A pack only `second` needs: it holds block 9 of image 1.
fn pack(f: &Fixture) -> std::path::PathBuf {
    f.pack_of(1, 9)
}

fn object(f: &Fixture, dir: &str) -> std::path::PathBuf {
    let mut found = files_under(&f.s.join("objects").join(dir), ".json");
    assert_eq!(found.len(), 1, "one {dir} object: {found:?}");
    found.pop().unwrap()
}

fn version_object(f: &Fixture) -> std::path::PathBuf {
    f.s.join(format!("objects/versions/{}.json", f.version_id("second")))
}

fn index_files(f: &Fixture, suffix: &str) -> Vec<std::path::PathBuf> {
    let found = files_under(&f.s.join("index"), suffix);
    assert!(!found.is_empty(), "no {suffix} file in the index");
    found
}

const PACK_LOST: Repair =
    Repair { clean: false, reads: [Img(0), Fails, Img(2)], did: "damaged_versions" };
const REBUILT: Repair = Repair { clean: true, reads: [Img(0), Img(1), Img(1)], did: "" };
const COPY_BACK: Repair =
    Repair { clean: true, reads: [Img(0), Img(1), Img(2)], did: "objects_restored" };
/// Damage that loses nothing: the store reads and checks as before.
const HARMLESS: Repair = Repair { clean: true, reads: ALL_READ, did: "" };
const LOST_INDEX: [Want; 3] = [Fails, Fails, Fails];
const ALL_READ: [Want; 3] = [Img(0), Img(1), Img(2)];

/// One test per row: `$test: Row { .. };` runs the row and prints its report.
macro_rules! rows {
    ($($(#[$m:meta])* $test:ident: $row:expr;)*) => {$(
        #[test]
        $(#[$m])*
        fn $test() {
            println!("{}", run(&$row));
        }
    )*};
}

rows! {
    pack_flipped: Row {
        name: "pack: byte flipped in the middle",
        damage: |f| flip_middle(&pack(f)),
        reads: [Img(0), Fails, Img(2)],
        fsck_flags: &["--deep"],
        names: "checksum",
        repair: PACK_LOST,
    };
    pack_cut: Row {
        name: "pack: cut to half its length",
        damage: |f| truncate_half(&pack(f)),
        reads: [Img(0), Fails, Img(2)],
        fsck_flags: &[],
        names: "pack ",
        repair: PACK_LOST,
    };
    pack_deleted: Row {
        name: "pack: deleted",
        damage: |f| std::fs::remove_file(pack(f)).unwrap(),
        reads: [Img(0), Fails, Img(2)],
        fsck_flags: &[],
        names: "pack ",
        repair: PACK_LOST,
    };
    segment_deleted: Row {
        name: "data log segment: deleted",
        damage: |f| std::fs::remove_file(f.segment()).unwrap(),
        reads: [Img(0), Img(1), Fails],
        fsck_flags: &[],
        names: "acknowledged write lost",
        repair: Repair { clean: true, reads: [Img(0), Img(1), Img(1)], did: "lost_writes_dropped" },
    };
    segment_flipped: Row {
        name: "data log segment: byte flipped in block 12's data",
        // The segment is the blocks' data back to back, in write order.
        damage: |f| flip(&f.segment(), 12 * BS as i64 + 100),
        reads: [Img(0), Img(1), Fails],
        fsck_flags: &[],
        names: "acknowledged write lost",
        repair: Repair { clean: true, reads: [Img(0), Img(1), Dropped(2, 1)], did: "lost_writes_dropped" },
    };
    segment_cut: Row {
        name: "data log segment: cut to half its length",
        damage: |f| truncate_half(&f.segment()),
        reads: [Img(0), Img(1), Fails],
        fsck_flags: &[],
        names: "acknowledged write lost",
        repair: Repair { clean: true, reads: [Img(0), Img(1), Dropped(2, 1)], did: "lost_writes_dropped" },
    };
    wal_deleted: Row {
        name: "index: WAL (*.log) deleted after a clean close",
        // A clean close flushes the memtables (`Db`'s drop), so the WAL
        // holds nothing the SSTs do not: every write is still there. (After
        // a crash the WAL alone holds the last writes: docs/RELIABILITY.md.)
        damage: |f| index_files(f, ".log").iter().for_each(|p| std::fs::remove_file(p).unwrap()),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "",
        repair: HARMLESS,
    };
    sst_deleted: Row {
        name: "index: an SST deleted",
        damage: |f| std::fs::remove_file(&index_files(f, ".sst")[0]).unwrap(),
        reads: LOST_INDEX,
        fsck_flags: &[],
        names: "index",
        repair: REBUILT,
    };
    sst_flipped: Row {
        name: "index: byte flipped in the middle of every SST",
        damage: |f| index_files(f, ".sst").iter().for_each(|p| flip_middle(p)),
        reads: LOST_INDEX,
        fsck_flags: &[],
        names: "index",
        repair: REBUILT,
    };
    index_deleted: Row {
        name: "index: directory deleted",
        damage: |f| std::fs::remove_dir_all(f.s.join("index")).unwrap(),
        reads: LOST_INDEX,
        fsck_flags: &[],
        names: "index",
        repair: REBUILT,
    };
    version_object_deleted: Row {
        name: "version record object: deleted",
        damage: |f| std::fs::remove_file(version_object(f)).unwrap(),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "is missing",
        repair: COPY_BACK,
    };
    version_object_flipped: Row {
        name: "version record object: byte flipped",
        damage: |f| flip(&version_object(f), 20),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "differs from the index",
        repair: COPY_BACK,
    };
    head_object_deleted: Row {
        name: "head record object: deleted",
        damage: |f| std::fs::remove_file(object(f, "heads")).unwrap(),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "is missing",
        repair: COPY_BACK,
    };
    head_object_cut: Row {
        name: "head record object: cut to half its length",
        damage: |f| truncate_half(&object(f, "heads")),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "differs from the index",
        repair: COPY_BACK,
    };
    volume_object_deleted: Row {
        name: "volume record object: deleted",
        damage: |f| std::fs::remove_file(object(f, "volumes")).unwrap(),
        reads: ALL_READ,
        fsck_flags: &[],
        names: "is missing",
        repair: COPY_BACK,
    };
}

/// Runs one row on a fresh store; returns its report line.
fn run(row: &Row) -> String {
    // Damaged right after the last command closed the store, before any
    // other process opens it.
    let f = Fixture::new();
    (row.damage)(&f);
    let what = row.name;
    let mut report = vec![format!("## {what}")];
    report.push(format!("reads: {}", f.reads(&row.reads, what).join(" | ")));

    let (code, found, _) = f.fsck(row.fsck_flags);
    // 1: findings; a store that cannot be opened: the error's exit code.
    let opened = !(found.len() == 1 && found[0].starts_with("forkfs-fsck: "));
    if row.names.is_empty() {
        assert_eq!(code, 0, "{what}: fsck found damage that lost nothing: {found:?}");
    } else {
        let want = if opened { 1 } else { 65 };
        assert_eq!(code, want, "{what}: fsck {:?}: {found:?}", row.fsck_flags);
        let all = found.join("\n");
        assert!(all.contains(row.names), "{what}: fsck does not name the damage:\n{all}");
    }
    report.push(format!("fsck {:?}: exit {code}: {}", row.fsck_flags, found.join(" / ")));

    // GC on the damaged store must delete nothing a reader needs.
    let gc = forkfs(&f.s, &["gc", "--grace", "0s"]);
    let said = String::from_utf8_lossy(if gc.status.success() { &gc.stdout } else { &gc.stderr });
    report.push(format!("gc: exit {}: {}", gc.status.code().unwrap_or(-1), said.trim()));
    f.reads(&row.reads, &format!("{what}: after gc"));

    let mut flags = row.fsck_flags.to_vec();
    flags.push("--repair");
    let (code, after, v) = f.fsck(&flags);
    report.push(format!(
        "fsck --repair: exit {code}: repair {} / after: {}",
        v["repair"],
        after.join(" / ")
    ));
    if row.repair.clean {
        assert_eq!(code, 0, "{what}: repair did not make the store pass: {v:#}");
        assert!(after.is_empty(), "{what}: {after:?}");
    } else {
        assert_eq!(code, 1, "{what}: fsck passed after repairing lost data: {v:#}");
    }
    if !row.repair.did.is_empty() {
        let list = v["repair"][row.repair.did].as_array();
        assert!(
            list.is_some_and(|l| !l.is_empty()),
            "{what}: repair did no {}: {v:#}",
            row.repair.did
        );
    }
    let reads = f.reads(&row.repair.reads, &format!("{what}: after repair"));
    report.push(format!("after repair: {}", reads.join(" | ")));
    let (code, found, _) = f.fsck(row.fsck_flags);
    assert_eq!(code == 0, row.repair.clean, "{what}: fsck after repair: {found:?}");
    report.join("\n")
}
