//! Sizes and per-process overrides, read the same way everywhere: a size
//! is binary (`8G` = 8 GiB, as on the command line), and an environment
//! variable that does not parse is ignored with a warning.

use crate::error::{Error, Result};

/// Parses sizes like `64G`, `512MiB`, `1T`, `4096` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| Error::invalid(format!("bad size {s:?}: {e}")))
}

/// `configured`, unless the environment variable `name` holds a value
/// `parse` accepts (one that it does not is ignored, with a warning).
pub fn env_override<T, E: std::fmt::Display>(
    name: &str,
    parse: impl Fn(&str) -> std::result::Result<T, E>,
    configured: T,
) -> T {
    let Ok(raw) = std::env::var(name) else { return configured };
    match parse(&raw) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "{name} is not valid; ignored");
            configured
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_are_binary_and_bad_ones_are_invalid() {
        assert_eq!(super::parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(super::parse_size("4096").unwrap(), 4096);
        let e = super::parse_size("12zz").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
    }
}
