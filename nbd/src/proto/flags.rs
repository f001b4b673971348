//! Small hand-written bit-set newtypes for the NBD flag fields (handshake,
//! client, transmission, command and structured-reply flags).
//!
//! Each type keeps every bit it was built from, including bits this module
//! does not name, so decoding never loses information; use
//! [`unknown_bits`](HandshakeFlags::unknown_bits) to detect unexpected ones.

use super::consts::*;
use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

/// Defines a `Copy` bit-set newtype over an unsigned integer.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        $name:ident($ty:ty) {
            $( $(#[$fmeta:meta])* $flag:ident = $value:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($ty);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: Self = Self($value); )*

            /// Union of every flag this type names.
            pub const ALL: Self = Self(0 $(| $value)*);

            /// The empty set.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// Wraps raw wire bits, keeping unknown ones.
            pub const fn from_bits_retain(bits: $ty) -> Self {
                Self(bits)
            }

            /// Raw wire bits.
            pub const fn bits(self) -> $ty {
                self.0
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Whether every bit of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether `self` and `other` share at least one bit.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// Bitwise union.
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// Bits set in `self` but not in `other`.
            pub const fn difference(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }

            /// Bits set that this type does not name.
            pub const fn unknown_bits(self) -> $ty {
                self.0 & !Self::ALL.0
            }

            /// Sets the bits of `other`.
            pub fn insert(&mut self, other: Self) {
                self.0 |= other.0;
            }

            /// Clears the bits of `other`.
            pub fn remove(&mut self, other: Self) {
                self.0 &= !other.0;
            }
        }

        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let mut first = true;
                $(
                    if self.contains(Self::$flag) && Self::$flag.0 != 0 {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(stringify!($flag))?;
                        first = false;
                    }
                )*
                let unknown = self.unknown_bits();
                if unknown != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{unknown:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_set! {
    /// Handshake flags the server sends in its greeting (16 bits).
    HandshakeFlags(u16) {
        /// `NBD_FLAG_FIXED_NEWSTYLE`.
        FIXED_NEWSTYLE = NBD_FLAG_FIXED_NEWSTYLE;
        /// `NBD_FLAG_NO_ZEROES`.
        NO_ZEROES = NBD_FLAG_NO_ZEROES;
    }
}

flag_set! {
    /// Client flags sent in reply to the greeting (32 bits).
    ClientFlags(u32) {
        /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
        FIXED_NEWSTYLE = NBD_FLAG_C_FIXED_NEWSTYLE;
        /// `NBD_FLAG_C_NO_ZEROES`.
        NO_ZEROES = NBD_FLAG_C_NO_ZEROES;
    }
}

flag_set! {
    /// Per-export transmission flags (16 bits); `HAS_FLAGS` must always be set.
    TransmissionFlags(u16) {
        /// `NBD_FLAG_HAS_FLAGS`.
        HAS_FLAGS = NBD_FLAG_HAS_FLAGS;
        /// `NBD_FLAG_READ_ONLY`.
        READ_ONLY = NBD_FLAG_READ_ONLY;
        /// `NBD_FLAG_SEND_FLUSH`.
        SEND_FLUSH = NBD_FLAG_SEND_FLUSH;
        /// `NBD_FLAG_SEND_FUA`.
        SEND_FUA = NBD_FLAG_SEND_FUA;
        /// `NBD_FLAG_ROTATIONAL`.
        ROTATIONAL = NBD_FLAG_ROTATIONAL;
        /// `NBD_FLAG_SEND_TRIM`.
        SEND_TRIM = NBD_FLAG_SEND_TRIM;
        /// `NBD_FLAG_SEND_WRITE_ZEROES`.
        SEND_WRITE_ZEROES = NBD_FLAG_SEND_WRITE_ZEROES;
        /// `NBD_FLAG_SEND_DF`.
        SEND_DF = NBD_FLAG_SEND_DF;
        /// `NBD_FLAG_CAN_MULTI_CONN`.
        CAN_MULTI_CONN = NBD_FLAG_CAN_MULTI_CONN;
        /// `NBD_FLAG_SEND_RESIZE` (experimental).
        SEND_RESIZE = NBD_FLAG_SEND_RESIZE;
        /// `NBD_FLAG_SEND_CACHE`.
        SEND_CACHE = NBD_FLAG_SEND_CACHE;
        /// `NBD_FLAG_SEND_FAST_ZERO`.
        SEND_FAST_ZERO = NBD_FLAG_SEND_FAST_ZERO;
        /// `NBD_FLAG_BLOCK_STATUS_PAYLOAD` (experimental).
        BLOCK_STATUS_PAYLOAD = NBD_FLAG_BLOCK_STATUS_PAYLOAD;
    }
}

flag_set! {
    /// Command flags of a transmission request (16 bits).
    CmdFlags(u16) {
        /// `NBD_CMD_FLAG_FUA`.
        FUA = NBD_CMD_FLAG_FUA;
        /// `NBD_CMD_FLAG_NO_HOLE`.
        NO_HOLE = NBD_CMD_FLAG_NO_HOLE;
        /// `NBD_CMD_FLAG_DF`.
        DF = NBD_CMD_FLAG_DF;
        /// `NBD_CMD_FLAG_REQ_ONE`.
        REQ_ONE = NBD_CMD_FLAG_REQ_ONE;
        /// `NBD_CMD_FLAG_FAST_ZERO`.
        FAST_ZERO = NBD_CMD_FLAG_FAST_ZERO;
        /// `NBD_CMD_FLAG_PAYLOAD_LEN` (experimental, never valid here).
        PAYLOAD_LEN = NBD_CMD_FLAG_PAYLOAD_LEN;
    }
}

flag_set! {
    /// Structured reply chunk flags (16 bits).
    ReplyFlags(u16) {
        /// `NBD_REPLY_FLAG_DONE`: last chunk of the reply.
        DONE = NBD_REPLY_FLAG_DONE;
    }
}

impl ReplyFlags {
    /// `DONE` if `done`, otherwise empty.
    pub const fn done_if(done: bool) -> Self {
        if done { Self::DONE } else { Self::empty() }
    }
}
