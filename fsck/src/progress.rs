//! A progress bar per stage on a terminal; nothing when output is piped.

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;

pub struct Bar {
    current: Mutex<Option<ProgressBar>>,
    enabled: bool,
}

impl Bar {
    pub fn new() -> Bar {
        Bar { current: Mutex::new(None), enabled: std::io::stderr().is_terminal() }
    }

    pub fn finish(&self) {
        if let Some(b) = self.current.lock().take() {
            b.finish_and_clear();
        }
    }
}

impl forkfs::Progress for Bar {
    fn stage(&self, name: &str, total: u64) {
        if !self.enabled {
            return;
        }
        let bar = if total == 0 { ProgressBar::new_spinner() } else { ProgressBar::new(total) };
        let style = ProgressStyle::with_template("{msg:>8} [{bar:30}] {pos}/{len} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        bar.set_message(name.to_string());
        if let Some(old) = self.current.lock().replace(bar) {
            old.finish_and_clear();
        }
    }

    fn advance(&self, n: u64) {
        if let Some(b) = self.current.lock().as_ref() {
            b.inc(n);
        }
    }
}
