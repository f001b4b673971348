//! The corruption matrix (docs/RELIABILITY.md): a store with flushed data,
//! two versions and acknowledged writes not yet in a version is damaged one
//! way at a time, on disk, as a failing disk or an operator would; then the
//! real binaries must (1) never return other content than was written: a
//! read either gives the exact bytes or fails in one line, (2) `forkfs
//! fsck` exits 1 naming the damage, (3) `forkfs gc` deletes nothing a
//! reader still needs, and (4) `forkfs fsck --repair` ends as the docs say.
//!
//! Each row prints what happened (`cargo nextest run --test maint
//! -E 'test(damage)' --no-capture`), which is what RELIABILITY.md's table
//! shows.

mod faults;
mod matrix;

use crate::common::{forkfs, ok};
use std::path::{Path, PathBuf};
use std::process::Output;

pub const BS: usize = 64 << 10;
pub const BLOCKS: usize = 16;

/// Which image a read must return.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Want {
    /// Exactly image N (0 = `first`, 1 = `second`, 2 = the head's unsaved writes).
    Img(usize),
    /// A one-line error with a non-zero exit.
    Fails,
    /// Every block is image `.0`'s or, where a lost write was dropped,
    /// image `.1`'s, and at least one block differs from image `.0`.
    Dropped(usize, usize),
}

/// The targets every row reads, in order.
pub const TARGETS: [&str; 3] = ["disk@first", "disk@second", "disk"];

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub s: PathBuf,
    pub imgs: [Vec<u8>; 3],
}

/// Image `prev` with `blocks` replaced by pseudo-random data.
fn image(prev: Option<&[u8]>, blocks: std::ops::Range<usize>, seed: u64) -> Vec<u8> {
    let mut img = prev.map_or_else(|| vec![0u8; BS * BLOCKS], |p| p.to_vec());
    for b in blocks {
        img[b * BS..(b + 1) * BS]
            .copy_from_slice(&crate::common::random(BS, seed * 1000 + b as u64));
    }
    img
}

impl Fixture {
    /// A 1 MiB block volume: `first` (16 blocks), `second` (blocks 8..16
    /// rewritten), and unsaved writes on the head (blocks 12..14 rewritten,
    /// the whole image written again and flushed, not folded), in 64 KiB packs.
    pub fn new() -> Fixture {
        Fixture::at(tempfile::tempdir().unwrap(), None)
    }

    /// The same, with the store directory at `store` (e.g. on a faulty
    /// filesystem); `dir` is kept alive with the fixture.
    pub fn at(dir: tempfile::TempDir, store: Option<PathBuf>) -> Fixture {
        let s = store.unwrap_or_else(|| dir.path().join("store"));
        let img1 = image(None, 0..BLOCKS, 1);
        let img2 = image(Some(&img1), 8..BLOCKS, 2);
        let img3 = image(Some(&img2), 12..14, 3);
        ok(&s, &["init", "--pack-size", "64KiB"]);
        let f = Fixture { _dir: dir, s, imgs: [img1, img2, img3] };
        for (i, name) in ["first", "second"].iter().enumerate() {
            let p = f.file(&format!("img{i}"));
            std::fs::write(&p, &f.imgs[i]).unwrap();
            ok(&f.s, &["import", "disk", p.to_str().unwrap()]);
            ok(&f.s, &["tag", "disk@~0", name]);
        }
        let p = f.file("img2");
        std::fs::write(&p, &f.imgs[2]).unwrap();
        ok(&f.s, &["import", "disk", p.to_str().unwrap(), "--no-snapshot"]);
        f
    }

    /// A path next to the store (outside it).
    pub fn file(&self, name: &str) -> PathBuf {
        self.s.parent().unwrap().join(name)
    }

    /// Exports `target`: its bytes, or (exit code, one-line error).
    pub fn export(&self, target: &str) -> Result<Vec<u8>, (i32, String)> {
        let out = self.file("out.img");
        let _ = std::fs::remove_file(&out);
        let o = forkfs(&self.s, &["export", target, out.to_str().unwrap()]);
        if o.status.success() {
            return Ok(std::fs::read(&out).unwrap());
        }
        Err(one_line_error(&o, &format!("export {target}")))
    }

    /// Checks that every target reads as wanted; returns what each did,
    /// for the row's report.
    pub fn reads(&self, want: &[Want], when: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for (target, w) in TARGETS.iter().zip(want) {
            let got = self.export(target);
            let what = format!("{when}: {target}");
            match (w, &got) {
                (Want::Img(i), Ok(b)) => {
                    assert!(b == &self.imgs[*i], "{what}: read other content than image {i}");
                    seen.push(format!("{target}: image {i}"));
                }
                (Want::Dropped(now, was), Ok(b)) => {
                    let mut dropped = 0;
                    for blk in 0..BLOCKS {
                        let r = blk * BS..(blk + 1) * BS;
                        let (x, a, o) =
                            (&b[r.clone()], &self.imgs[*now][r.clone()], &self.imgs[*was][r]);
                        assert!(x == a || x == o, "{what}: block {blk} is neither image's");
                        dropped += usize::from(x != a);
                    }
                    assert!(dropped > 0, "{what}: no block went back to image {was}");
                    seen.push(format!("{target}: {dropped} blocks back to the last version"));
                }
                (Want::Fails, Err((code, err))) => {
                    seen.push(format!("{target}: exit {code}: {err}"))
                }
                (_, Ok(_)) => panic!("{what}: read succeeded, wanted {w:?}"),
                (_, Err((code, err))) => panic!("{what}: failed ({code}: {err}), wanted {w:?}"),
            }
        }
        seen
    }

    /// `forkfs fsck FLAGS`: (exit code, findings). A store that cannot be
    /// opened for checking gives its one-line error as the only finding.
    pub fn fsck(&self, flags: &[&str]) -> (i32, Vec<String>, serde_json::Value) {
        let mut args = vec!["--json", "fsck"];
        args.extend_from_slice(flags);
        let o = forkfs(&self.s, &args);
        let code = o.status.code().unwrap_or(-1);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked"), "fsck {flags:?} panicked: {stderr}");
        match serde_json::from_slice::<serde_json::Value>(&o.stdout) {
            Ok(v) => {
                let report = if v.get("after_repair").is_some() { &v["after_repair"] } else { &v };
                let list = report["problems"].as_array().expect("a problems list");
                let p = list.iter().map(|p| p.as_str().unwrap().to_string()).collect();
                (code, p, v)
            }
            Err(_) => {
                let (code, err) = one_line_error(&o, &format!("fsck {flags:?}"));
                (code, vec![err], serde_json::Value::Null)
            }
        }
    }

    /// The pack object holding block `blk` of image `img`.
    pub fn pack_of(&self, img: usize, blk: usize) -> PathBuf {
        let id = blake3::hash(&self.imgs[img][blk * BS..(blk + 1) * BS]);
        packs(&self.s)
            .into_iter()
            .find(|p| footer_ids(&std::fs::read(p).unwrap()).contains(id.as_bytes()))
            .unwrap_or_else(|| panic!("no pack holds block {blk} of image {img}"))
    }

    /// The data log segment holding the head's unsaved writes.
    pub fn segment(&self) -> PathBuf {
        let mut segs = files_under(&self.s.join("log"), ".seg");
        segs.retain(|p| std::fs::metadata(p).unwrap().len() > 0);
        assert_eq!(segs.len(), 1, "one data log segment with data: {segs:?}");
        segs.pop().unwrap()
    }

    /// The id of the version tagged `name` (from its tag object).
    pub fn version_id(&self, name: &str) -> String {
        let tags = files_under(&self.s.join("objects/tags"), name);
        let id = std::fs::read_to_string(&tags[0]).unwrap();
        id.trim().trim_matches('"').to_string()
    }
}

/// A failed command's (exit code, error), checked to be one forkfs line.
fn one_line_error(o: &Output, what: &str) -> (i32, String) {
    let err = String::from_utf8_lossy(&o.stderr).trim_end().to_string();
    assert!(!o.status.success(), "{what} succeeded");
    assert!(!err.contains("panicked"), "{what} panicked: {err}");
    assert!(err.starts_with("forkfs"), "{what}: not a forkfs error: {err:?}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err:?}");
    (o.status.code().unwrap_or(-1), err)
}

/// Chunk ids in a pack's footer (docs/FORMAT.md: trailer = count u32 |
/// footer_offset u64 | blake3 [32] | magic [8]; entries of 49 bytes).
fn footer_ids(pack: &[u8]) -> Vec<[u8; 32]> {
    let t = &pack[pack.len() - 52..];
    let count = u32::from_le_bytes(t[0..4].try_into().unwrap()) as usize;
    let at = u64::from_le_bytes(t[4..12].try_into().unwrap()) as usize;
    (0..count).map(|i| pack[at + i * 49..at + i * 49 + 32].try_into().unwrap()).collect()
}

pub fn packs(s: &Path) -> Vec<PathBuf> {
    files_under(&s.join("objects/packs"), ".pack")
}

/// Files under `dir` (recursively) whose name ends with `suffix`, sorted.
pub fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap().to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Flips one byte of `path` at `at` (from the end when negative).
pub fn flip(path: &Path, at: i64) {
    let mut b = std::fs::read(path).unwrap();
    let i = if at < 0 { b.len() - (-at) as usize } else { at as usize };
    b[i] ^= 0x55;
    std::fs::write(path, b).unwrap();
}

/// Flips the byte in the middle of `path`.
pub fn flip_middle(path: &Path) {
    let n = std::fs::metadata(path).unwrap().len() as i64;
    flip(path, n / 2);
}

/// Cuts `path` to half its length.
pub fn truncate_half(path: &Path) {
    let n = std::fs::metadata(path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(n / 2).unwrap();
}
