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
        // The bar fills with the steps done; the prefix names the step
        // under way ("2/6"), as the plain lines do; a long message is cut
        // at the terminal's width (wide_msg) rather than wrapped.
        let style = ProgressStyle::with_template("{spinner} [{elapsed:>4}] [{bar:20}] {prefix} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(120));
        // The step's name, its bytes (while packages come) and its latest
        // news, which make the message.
        let state = Arc::new(Mutex::new((String::new(), None::<u64>, String::new())));
        let b = bar.clone();
        let report: Reporter = Arc::new(move |p: Progress<'_>| {
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            let (step, bytes, news) = &mut *state;
            match p {
                Progress::Step { number, of, what } => {
                    b.set_length(of as u64);
                    b.set_position(number as u64 - 1);
                    b.set_prefix(format!("{number}/{of}"));
                    *step = what.to_string();
                    *bytes = None;
                    news.clear();
                }
                Progress::Bytes(n) => *bytes = Some(n),
                Progress::Note(text) => *news = text.to_string(),
            }
            let bytes = bytes.map(|n| format!(" ({} of packages)", HumanBytes(n))).unwrap_or_default();
            let news = if news.is_empty() { String::new() } else { format!(": {news}") };
            b.set_message(format!("{step}{bytes}{news}"));
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
