//! READ buffers reused across requests. A READ's buffer goes back here
//! once its reply is written, so the next READ neither allocates nor
//! zeroes one: the store's reads fill every byte of the buffer they are
//! given (`BlockMap::read`: data copied, holes zero-filled) or fail, and a
//! failed READ sends no data. Kept buffers are bounded in number of bytes
//! and in size, so idle memory stays small (see docs/OPERATIONS.md,
//! "Limits").

use parking_lot::Mutex;

/// Bytes kept in all, and the largest buffer kept.
const KEEP_BYTES: usize = 32 << 20;
const KEEP_LARGEST: usize = 4 << 20;

#[derive(Default)]
pub struct Buffers(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    free: Vec<Vec<u8>>,
    bytes: usize,
}

/// The server's one pool.
pub static BUFFERS: std::sync::LazyLock<Buffers> = std::sync::LazyLock::new(Buffers::default);

impl Buffers {
    /// A buffer of `len` bytes whose contents are unspecified (a reused
    /// buffer keeps an earlier READ's bytes): the caller overwrites all of
    /// them before any is sent.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let found = {
            let mut k = self.0.lock();
            let at = k.free.iter().position(|b| b.capacity() >= len);
            at.map(|i| {
                let b = k.free.swap_remove(i);
                k.bytes -= b.capacity();
                b
            })
        };
        match found {
            Some(mut b) => {
                // Shrinking writes nothing; growing (within the capacity)
                // zeroes only the new part.
                b.truncate(len);
                b.resize(len, 0);
                b
            }
            None => vec![0; len],
        }
    }

    /// Gives a buffer back (kept if it fits the bounds, else freed).
    pub fn give(&self, b: Vec<u8>) {
        let cap = b.capacity();
        if cap == 0 || cap > KEEP_LARGEST {
            return;
        }
        let mut k = self.0.lock();
        if k.bytes + cap <= KEEP_BYTES {
            k.bytes += cap;
            k.free.push(b);
        }
    }

    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.0.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_within_their_bounds() {
        let pool = Buffers::default();
        let mut a = pool.take(1 << 20);
        a.fill(7);
        let ptr = a.as_ptr();
        pool.give(a);
        assert_eq!(pool.kept_bytes(), 1 << 20);
        // A smaller request reuses it, at the length asked for.
        let b = pool.take(4096);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 4096));
        assert_eq!(pool.kept_bytes(), 0);
        pool.give(b);
        // Too large to keep; and no more than KEEP_BYTES in all.
        pool.give(vec![0; KEEP_LARGEST + 1]);
        for _ in 0..(KEEP_BYTES / KEEP_LARGEST + 3) {
            pool.give(vec![0; KEEP_LARGEST]);
        }
        assert!(pool.kept_bytes() <= KEEP_BYTES);
        // Nothing large enough: a new, zeroed buffer.
        let p = Buffers::default();
        p.give(vec![1; 16]);
        assert_eq!(p.take(32), vec![0; 32]);
    }
}
