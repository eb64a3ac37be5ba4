//! A progress line on stderr: items, bytes, rate and ETA. Redrawn in place
//! at most ten times a second on a terminal; on a pipe or file a line is
//! printed every 10% so logs stay short.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total_items: usize,
    total_bytes: u64,
    start: Instant,
    last_draw: Option<Instant>,
    last_decile: u64,
    tty: bool,
    quiet: bool,
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl Progress {
    pub fn new(label: &str, total_items: usize, total_bytes: u64, quiet: bool) -> Self {
        Progress {
            label: label.to_string(),
            total_items,
            total_bytes,
            start: Instant::now(),
            last_draw: None,
            last_decile: 0,
            tty: std::io::stderr().is_terminal(),
            quiet,
        }
    }

    pub fn update(&mut self, items: usize, bytes: u64) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let done = bytes >= self.total_bytes && items >= self.total_items;
        let decile = bytes
            .saturating_mul(10)
            .checked_div(self.total_bytes)
            .unwrap_or(10);
        let draw = if self.tty {
            done || self
                .last_draw
                .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(100))
        } else {
            decile > self.last_decile || self.last_draw.is_none()
        };
        if !draw {
            return;
        }
        self.last_draw = Some(now);
        self.last_decile = decile;
        let elapsed = now.duration_since(self.start).as_secs_f64().max(1e-6);
        let rate = bytes as f64 / elapsed;
        let eta = if rate > 0.0 && self.total_bytes > bytes {
            human_duration(Duration::from_secs_f64(
                (self.total_bytes - bytes) as f64 / rate,
            ))
        } else {
            "0s".to_string()
        };
        let items_part = if self.total_items > 0 {
            format!("{items}/{} tensors  ", self.total_items)
        } else {
            String::new()
        };
        let line = format!(
            "{} {items_part}{} / {}  {}/s  ETA {eta}",
            self.label,
            human_bytes(bytes),
            human_bytes(self.total_bytes),
            human_bytes(rate as u64),
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Ends the line (on a terminal).
    pub fn finish(&mut self) {
        if self.tty && !self.quiet && self.last_draw.is_some() {
            eprintln!();
        }
    }
}
