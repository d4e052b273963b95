//! How `ftvm image build` shows its progress: a bar of the build's steps
//! with the current one, its bytes and its latest news on a terminal
//! (indicatif), plain lines on stderr otherwise (a log, CI), nothing with
//! `--quiet`.

use ftvm_image::{Progress, Reporter};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most one plain line of bytes this often (a slow mirror would
/// otherwise fill a log with them).
const BYTES_EVERY: Duration = Duration::from_secs(2);

/// The display of one build; [`Display::finish`] clears the bar.
pub struct Display {
    bar: Option<ProgressBar>,
}

/// What a plain display remembers between calls.
struct Plain {
    start: Instant,
    bytes: u64,
    bytes_shown: u64,
    bytes_at: Option<Instant>,
}

impl Plain {
    fn line(&self, text: &str) {
        eprintln!("ftvm image: [{:6.1}s] {text}", self.start.elapsed().as_secs_f64());
    }

    fn show_bytes(&mut self) {
        if self.bytes != self.bytes_shown {
            self.line(&format!("  {} of packages at hand", HumanBytes(self.bytes)));
            self.bytes_shown = self.bytes;
            self.bytes_at = Some(Instant::now());
        }
    }
}

/// The reporter for a build, and its display.
pub fn reporter(quiet: bool) -> (Option<Reporter>, Display) {
    if quiet {
        return (None, Display { bar: None });
    }
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(1);
        let style = ProgressStyle::with_template("{spinner} [{elapsed:>4}] [{bar:20}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(120));
        // The step's name, to which the bytes and news are added.
        let step = Arc::new(Mutex::new(String::new()));
        let b = bar.clone();
        let report: Reporter = Arc::new(move |p: Progress<'_>| {
            let mut step = step.lock().unwrap_or_else(|e| e.into_inner());
            match p {
                Progress::Step { number, of, what } => {
                    b.set_length(of as u64);
                    b.set_position(number as u64 - 1);
                    *step = what.to_string();
                    b.set_message(what.to_string());
                }
                Progress::Bytes(n) => b.set_message(format!("{step}: {} at hand", HumanBytes(n))),
                Progress::Note(text) => b.set_message(format!("{step}: {text}")),
            }
        });
        return (Some(report), Display { bar: Some(bar) });
    }
    let plain = Mutex::new(Plain { start: Instant::now(), bytes: 0, bytes_shown: 0, bytes_at: None });
    let report: Reporter = Arc::new(move |p: Progress<'_>| {
        let mut plain = plain.lock().unwrap_or_else(|e| e.into_inner());
        match p {
            Progress::Step { number, of, what } => {
                plain.show_bytes();
                plain.line(&format!("[{number}/{of}] {what}"));
            }
            Progress::Bytes(n) => {
                plain.bytes = n;
                if plain.bytes_at.is_none_or(|t| t.elapsed() >= BYTES_EVERY) {
                    plain.show_bytes();
                }
            }
            Progress::Note(text) => plain.line(&format!("  {text}")),
        }
    });
    (Some(report), Display { bar: None })
}

impl Display {
    /// The build ended (either way): the bar goes, leaving the terminal
    /// to the result's line.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
