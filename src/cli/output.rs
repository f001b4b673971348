//! Formatting for people (sizes, ages, tables) and JSON for scripts.

pub use super::held::print_json;

/// 1536 -> "1.5 KiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// Age of a timestamp in milliseconds, e.g. "3m ago".
pub fn age(ms: u64) -> String {
    let now = forkfs::now_ms();
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// Parses sizes like 64G, 512MiB, 1T, 4096 (the library's reading).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    Ok(forkfs::parse_size(s)?)
}

/// A progress bar on a terminal, nothing otherwise.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.set_message(what.to_string());
    bar
}

/// Progress of a library operation, one bar per stage, on a terminal.
pub struct Stages(parking_lot::Mutex<Option<indicatif::ProgressBar>>);

impl Stages {
    pub fn new() -> Stages {
        Stages(parking_lot::Mutex::new(None))
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        if let Some(b) = self.0.lock().take() {
            b.finish_and_clear();
        }
    }
}

impl forkfs::Progress for Stages {
    fn stage(&self, name: &str, total: u64) {
        let bar = progress(total, name);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}") {
            bar.set_style(style.progress_chars("=> "));
        }
        if let Some(old) = self.0.lock().replace(bar) {
            old.finish_and_clear();
        }
    }

    fn advance(&self, n: u64) {
        if let Some(b) = self.0.lock().as_ref() {
            b.inc(n);
        }
    }
}
