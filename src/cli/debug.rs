//! Hidden commands used by the crash tests.

use super::Global;
use forkfs::{SnapshotOptions, VolumeKind};
use rand::{Rng, SeedableRng};
use std::io::Write;

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Write and snapshot a block volume forever, printing
    /// `pending HASH` before each snapshot and `committed ID HASH` after it.
    CrashLoop {
        volume: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Stop after this many snapshots (0 = never)
        #[arg(long, default_value_t = 0)]
        iterations: u64,
    },
}

pub fn run(g: &Global, c: Cmd) -> anyhow::Result<()> {
    let Cmd::CrashLoop { volume, seed, iterations } = c;
    let store = g.open()?;
    if store.volumes().get(&volume).is_err() {
        store.volumes().create(&volume, VolumeKind::Block, Some(8 << 20), Some(64 << 10))?;
        // The crash test checks that every reported version survives:
        // retention must not thin them.
        store.volumes().set_retention(&volume, None, false)?;
    }
    let head = store.volumes().open_block(&volume)?;
    let size = head.size() as usize;
    // The model starts from whatever the head holds, committed or not.
    let mut model = vec![0u8; size];
    head.read_at(0, &mut model)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = std::io::stdout().lock();
    let mut n = 0u64;
    loop {
        for _ in 0..rng.random_range(1..12) {
            let len = match rng.random_range(0..3) {
                0 => rng.random_range(1..5000),
                1 => 64 << 10,
                _ => rng.random_range(1..300_000),
            };
            let off = rng.random_range(0..size - len);
            if rng.random_ratio(1, 6) {
                head.write_zeroes(off as u64, len as u64)?;
                model[off..off + len].fill(0);
            } else {
                let byte: u8 = rng.random();
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add((i / 512) as u8)).collect();
                head.write_at(off as u64, &data)?;
                model[off..off + len].copy_from_slice(&data);
            }
        }
        let hash = blake3::hash(&model).to_hex();
        writeln!(out, "pending {hash}")?;
        out.flush()?;
        let v = store.graph().snapshot(
            &volume,
            &SnapshotOptions { origin: Some(forkfs::Origin::Auto), ..Default::default() },
        )?;
        writeln!(out, "committed {} {hash}", v.id)?;
        out.flush()?;
        n += 1;
        if iterations != 0 && n >= iterations {
            return Ok(());
        }
    }
}
