//! Execution lag and its control (VMware FT §3.2).
//!
//! The backup's acknowledgements carry the instruction count it has
//! executed. The primary keeps a short history of when it was at which
//! instruction count, so the lag in real time is how long ago the primary
//! was where the backup is now. When the lag passes a threshold the
//! primary's CPU share is lowered gradually, in a feedback loop, and
//! given back as the backup catches up (see [`Throttle`]). Below the
//! threshold a gentler trim keeps a backup that is only a little slower
//! from walking the lag up to it.

use crate::duty::DutyCycle;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// History kept beyond the backup's position, at most.
const HISTORY: usize = 1 << 16;

#[derive(Default)]
pub struct LagMeter {
    /// (instruction count, when the primary reached it), increasing.
    samples: VecDeque<(u64, Instant)>,
}

impl LagMeter {
    /// The primary ran from where it was last noted, starting at
    /// `started`, and has executed up to `icount` now.
    pub fn note(&mut self, icount: u64, started: Instant, now: Instant) {
        // It was still at the last count when this run started: after an
        // idle stretch, a backup that has caught up to it is not behind by
        // the length of that stretch.
        if let Some((_, t)) = self.samples.back_mut() {
            *t = (*t).max(started);
        }
        if self.samples.back().is_none_or(|(i, _)| icount > *i) {
            if self.samples.len() == HISTORY {
                self.samples.pop_front();
            }
            self.samples.push_back((icount, now));
        }
    }

    /// How far behind the backup, at `backup_icount`, is at `now`.
    pub fn lag(&mut self, backup_icount: u64, now: Instant) -> Duration {
        // Samples the backup has passed are of no more use.
        while self.samples.len() > 1 && self.samples[1].0 <= backup_icount {
            self.samples.pop_front();
        }
        match self.samples.front() {
            // The primary was at or just past the backup's position then.
            Some(&(i, t)) if i >= backup_icount => now.saturating_duration_since(t),
            // Between the first and second sample: the second is when the
            // primary got past it.
            Some(_) => self.samples.get(1).map_or(Duration::ZERO, |&(_, t)| now.saturating_duration_since(t)),
            None => Duration::ZERO,
        }
    }
}

/// The primary's CPU share (1.0 runs flat out) and the feedback loop that
/// sets it.
///
/// VMware FT lowers the CPU limit a little at a time while the lag stays
/// high. A fixed step alone makes the lag swing: the share keeps falling
/// until the lag has turned, overshoots what the backup can follow, and
/// the lag then falls far under the threshold before the share climbs
/// back, over and over. So once the lag has passed the threshold, each
/// step aims the share at what the backup has shown it can follow (its
/// measured rate over the primary's), less a proportional term that
/// drains the lag toward `target` within about [`DRAIN`]; the share moves
/// toward that aim at most [`MAX_STEP`] per step, so it still changes
/// gradually. It is given back (and the loop disengaged) once the lag is
/// under the target and the aim is the whole CPU.
///
/// Under the threshold the share is trimmed in proportion to how far the
/// lag's floor stands above `trim_from` (three quarters of the target),
/// down to no less than [`TRIM_FLOOR`]. Why: a backup that replays only
/// 1 % slower than its primary (two vCPUs sharing one L3 do that for tens
/// of seconds) walks the lag from tens of milliseconds to the threshold
/// within a minute, and the loop above only then brings it down, so the
/// typical lag would be hundreds of milliseconds. A backup `d` slower
/// holds the floor about `d / TRIM_GAIN` above, for a cost of about `d`,
/// which the primary pays anyway once the lag reaches the threshold.
///
/// The floor is the least lag of the last [`TRIM_WINDOW`]: what a slower
/// backup raises, and what a backup that keeps up comes back down to. The
/// lag of a backup that keeps up swings well above `trim_from` on a
/// shared host (50 ms of it is the go-live points' spacing, and a stall
/// of either host's core adds hundreds of milliseconds until the other's
/// stalls even it out); trimming by the lag's mean paid for those swings
/// with 3-5 % of a CPU-bound primary's time (`bench/ft-overhead --only
/// cpu`: the VM paused 280-680 ms of a 13-15 s run; none with the trim
/// off) and did not keep the lag down either.
pub struct Throttle {
    share: f64,
    threshold: Duration,
    /// The lag the loop steers to once engaged.
    target: Duration,
    /// The lag above which the share is trimmed while not engaged.
    trim_from: Duration,
    /// The least lag seen since the last step (`Duration::MAX`: none yet).
    step_least: Duration,
    /// The least lag of each of the last steps, newest last (at most
    /// [`TRIM_WINDOW`] of them).
    floors: VecDeque<Duration>,
    engaged: bool,
    last_update: Instant,
    /// Instructions the primary ran and the time it ran them, since the
    /// last step.
    ran: (u64, Duration),
    /// The primary's instruction count when it last ran.
    last_icount: Option<u64>,
    /// The primary's speed while it runs, in instructions per second.
    primary_rate: Option<f64>,
    /// Where the backup was at the last step, and when.
    backup_mark: Option<(u64, Instant)>,
    /// The backup's speed, in instructions per second.
    backup_rate: Option<f64>,
    /// Times the loop engaged so far.
    engagements: u64,
    /// Time the primary paused for the share, in all.
    paused_total: Duration,
    /// The pauses that keep it to the share.
    duty: DutyCycle,
}

/// How often the share moves.
const STEP_EVERY: Duration = Duration::from_millis(250);
const MIN_SHARE: f64 = 0.05;
/// The most the share moves in one step.
const MAX_STEP: f64 = 0.15;
/// The time over which the proportional term means to drain the lag in
/// excess of the target.
const DRAIN: Duration = Duration::from_secs(2);
/// Weight of a new rate measurement in the smoothed rates: a step is
/// 250 ms, so the rates follow over about a second.
const SMOOTHING: f64 = 0.3;
/// The trim per second of the lag's floor above `trim_from`: 25 ms above trims
/// 5 %, and the lag settles back with a time constant of half a second.
/// A backup 3 % slower then holds the lag 15 ms above `trim_from`.
const TRIM_GAIN: f64 = 2.0;
/// The lowest share the trim sets; a backup slower than that takes the
/// lag to the threshold, and the loop proper.
const TRIM_FLOOR: f64 = 0.9;
/// The most the trim moves in one step.
const TRIM_STEP: f64 = 0.02;
/// The steps over which the lag's floor is taken (two seconds): longer
/// than a shared host's stalls take to even out, short against the
/// minute a backup 1-2 % slower takes to walk the lag to the threshold.
const TRIM_WINDOW: usize = 8;

fn smooth(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + SMOOTHING * (new - o)))
}

impl Throttle {
    /// A loop that engages when the lag passes `threshold` and then
    /// steers it to a tenth of that (VMware's typical lag, 100 ms, for
    /// the default 1 s).
    pub fn new(threshold: Duration) -> Throttle {
        Throttle {
            share: 1.0,
            threshold,
            target: threshold / 10,
            trim_from: threshold * 3 / 40,
            step_least: Duration::MAX,
            floors: VecDeque::new(),
            engaged: false,
            last_update: Instant::now(),
            ran: (0, Duration::ZERO),
            last_icount: None,
            primary_rate: None,
            backup_mark: None,
            backup_rate: None,
            engagements: 0,
            paused_total: Duration::ZERO,
            duty: DutyCycle::default(),
        }
    }

    pub fn share(&self) -> f64 {
        self.share
    }

    /// Whether the loop is holding the primary back (or about to).
    pub fn engaged(&self) -> bool {
        self.engaged
    }

    /// Whether the share is trimmed under the threshold.
    pub fn trimming(&self) -> bool {
        !self.engaged && self.share < 1.0
    }

    /// How many times the loop has engaged.
    pub fn engagements(&self) -> u64 {
        self.engagements
    }

    /// How long the primary has paused for its share, in all.
    pub fn paused_total(&self) -> Duration {
        self.paused_total
    }

    /// The smoothed speeds, in instructions per second, of the primary
    /// while it runs and of the backup, once measured.
    pub fn rates(&self) -> (Option<f64>, Option<f64>) {
        (self.primary_rate, self.backup_rate)
    }

    /// The primary ran for `busy`, to instruction count `icount`.
    pub fn ran_to(&mut self, icount: u64, busy: Duration) {
        // The first count only marks where the primary started (a VM
        // restored from a snapshot starts far from zero).
        self.ran.0 += self.last_icount.map_or(0, |last| icount.saturating_sub(last));
        self.ran.1 += busy;
        self.last_icount = Some(icount);
    }

    /// A step of the loop, at most every [`STEP_EVERY`], given the lag and
    /// the instruction count the backup has executed.
    pub fn update(&mut self, lag: Duration, backup_icount: u64, now: Instant) {
        self.step_least = self.step_least.min(lag);
        if now.duration_since(self.last_update) < STEP_EVERY {
            return;
        }
        self.last_update = now;
        self.measure(backup_icount, now);
        if self.floors.len() == TRIM_WINDOW {
            self.floors.pop_front();
        }
        self.floors.push_back(std::mem::replace(&mut self.step_least, Duration::MAX));
        if !self.engaged {
            if lag <= self.threshold {
                self.trim(self.floors.iter().copied().min().unwrap_or(lag));
                return;
            }
            self.engaged = true;
            self.engagements += 1;
        }
        let aim = match (self.backup_rate, self.primary_rate) {
            (Some(b), Some(p)) if b > 0.0 && p > 0.0 => {
                let excess = (lag.as_secs_f64() - self.target.as_secs_f64()) / DRAIN.as_secs_f64();
                // Under the target the primary may outrun the backup, but
                // not by more than half again.
                let follow = b / (1.0 + excess.clamp(-1.0 / 3.0, 1.0)) / p;
                // A backup that has caught up runs no faster than it is
                // fed, so its rate understates it: give back a little more.
                if lag < self.target {
                    follow.max(self.share * 1.1 + 0.02)
                } else {
                    follow
                }
            }
            // No rates yet: the plain step of VMware FT.
            _ if lag > self.threshold => self.share * 0.95,
            _ => self.share * 1.05 + 0.01,
        };
        let aim = aim.clamp(MIN_SHARE, 1.0);
        self.share = (self.share + (aim - self.share).clamp(-MAX_STEP, MAX_STEP)).clamp(MIN_SHARE, 1.0);
        if lag < self.target && aim >= 1.0 && self.share >= 1.0 {
            self.engaged = false;
        }
    }

    /// A step of the trim under the threshold, given the lag's floor.
    fn trim(&mut self, floor: Duration) {
        let above = floor.saturating_sub(self.trim_from).as_secs_f64();
        let aim = (1.0 - TRIM_GAIN * above).max(TRIM_FLOOR);
        self.share = (self.share + (aim - self.share).clamp(-TRIM_STEP, TRIM_STEP)).clamp(MIN_SHARE, 1.0);
    }

    /// Updates the smoothed rates from what happened since the last step.
    fn measure(&mut self, backup_icount: u64, now: Instant) {
        let (instructions, busy) = std::mem::take(&mut self.ran);
        // A step that ran next to nothing (an idle guest) says nothing of
        // the primary's speed.
        if busy >= STEP_EVERY / 10 {
            self.primary_rate = smooth(self.primary_rate, instructions as f64 / busy.as_secs_f64());
        }
        if let Some((was, then)) = self.backup_mark {
            let secs = now.duration_since(then).as_secs_f64();
            if secs > 0.0 && backup_icount >= was {
                self.backup_rate = smooth(self.backup_rate, (backup_icount - was) as f64 / secs);
            }
        }
        self.backup_mark = Some((backup_icount, now));
    }

    /// The pause that keeps the primary to its share after it ran for
    /// `busy` (see [`DutyCycle::pause_after`]). Tell [`Throttle::paused`]
    /// how long the pause was.
    pub fn pause_after(&mut self, busy: Duration) -> Duration {
        self.duty.pause_after(self.share, busy)
    }

    /// The primary paused for `slept` (a sleep may overshoot).
    pub fn paused(&mut self, slept: Duration) {
        self.paused_total += slept;
        self.duty.paused(slept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_how_long_ago_the_primary_was_there() {
        let t0 = Instant::now();
        let mut m = LagMeter::default();
        // Runs of 100 ms, back to back.
        for k in 0..10u64 {
            let started = t0 + Duration::from_millis(k.saturating_sub(1) * 100);
            m.note(k * 1000, started, t0 + Duration::from_millis(k * 100));
        }
        let now = t0 + Duration::from_millis(900);
        // The backup only moves forward.
        assert_eq!(m.lag(5000, now), Duration::from_millis(400));
        // Between samples: the primary passed 5500 by the 600 ms sample.
        assert_eq!(m.lag(5500, now), Duration::from_millis(300));
        assert_eq!(m.lag(9000, now), Duration::ZERO);
        assert_eq!(m.lag(20_000, now), Duration::ZERO);
    }

    #[test]
    fn an_idle_stretch_both_sides_sat_through_is_no_lag() {
        let t0 = Instant::now();
        let mut m = LagMeter::default();
        m.note(1000, t0, t0);
        // The guest idles 3 s at 1000, then runs on for 10 ms.
        let woke = t0 + Duration::from_secs(3);
        m.note(2000, woke, woke + Duration::from_millis(10));
        // The backup stands where the primary slept.
        assert_eq!(m.lag(1000, woke + Duration::from_millis(20)), Duration::from_millis(20));
        assert_eq!(m.lag(1500, woke + Duration::from_millis(20)), Duration::from_millis(10));
    }

    /// A primary that runs 100 M instructions a second beside a backup
    /// that can replay `backup_speed(t)` a second, in 10 ms chunks; returns
    /// (time, lag, share) after each chunk.
    fn simulate(seconds: f64, backup_speed: impl Fn(f64) -> f64) -> Vec<(f64, Duration, f64)> {
        const PRIMARY: f64 = 100e6;
        let t0 = Instant::now();
        let mut th = Throttle::new(Duration::from_secs(1));
        let mut meter = LagMeter::default();
        let (mut t, mut primary, mut backup) = (0.0f64, 0u64, 0f64);
        let mut out = Vec::new();
        let busy = Duration::from_millis(10);
        while t < seconds {
            let started = t0 + Duration::from_secs_f64(t);
            let pause = th.pause_after(busy);
            th.paused(pause);
            let elapsed = busy + pause;
            primary += (PRIMARY * busy.as_secs_f64()) as u64;
            backup = (backup + backup_speed(t) * elapsed.as_secs_f64()).min(primary as f64);
            t += elapsed.as_secs_f64();
            let now = t0 + Duration::from_secs_f64(t);
            meter.note(primary, started, started + busy);
            let lag = meter.lag(backup as u64, now);
            th.ran_to(primary, busy);
            th.update(lag, backup as u64, now);
            out.push((t, lag, th.share()));
        }
        out
    }

    #[test]
    fn a_backup_that_keeps_up_is_left_alone() {
        let run = simulate(30.0, |_| 100e6);
        assert!(run.iter().all(|&(_, lag, share)| lag < Duration::from_millis(50) && share == 1.0));
    }

    /// The lag a CPU-bound guest's backup shows on a shared host, though
    /// it replays as fast as its primary runs: a saw-tooth from 50 to 100
    /// ms (it reports where it stands as each go-live point arrives, one
    /// every 50 ms, and stops at the last one it has), and a stall now and
    /// then (its host's core taken for a while: 150-300 ms more, gone over
    /// the next second as the primary's own stalls even it out).
    fn shared_host_lag(t: f64) -> Duration {
        let saw = 50.0 + 50.0 * (t * 20.0).fract();
        let since = t % 1.7;
        let stall = if since < 1.0 { (1.0 - since) * (150.0 + 150.0 * ((t / 1.7).floor() % 2.0)) } else { 0.0 };
        Duration::from_secs_f64((saw + stall) / 1000.0)
    }

    #[test]
    fn a_backup_that_keeps_up_on_a_shared_host_is_left_alone() {
        let t0 = Instant::now();
        let mut th = Throttle::new(Duration::from_secs(1));
        let (busy, mut t, mut icount) = (Duration::from_millis(5), 0.0f64, 0u64);
        let (mut ran, mut paused) = (Duration::ZERO, Duration::ZERO);
        while t < 60.0 {
            let pause = th.pause_after(busy);
            th.paused(pause);
            ran += busy;
            paused += pause;
            t += (busy + pause).as_secs_f64();
            icount += 500_000;
            th.ran_to(icount, busy);
            // The backup as far behind as the lag says, at the same speed.
            let lag = shared_host_lag(t);
            th.update(lag, icount.saturating_sub((lag.as_secs_f64() * 1e8) as u64), t0 + Duration::from_secs_f64(t));
        }
        let share = ran.as_secs_f64() / (ran + paused).as_secs_f64();
        assert!(share > 0.995, "the primary ran {:.1} % of the time ({} ms paused)", share * 100.0, paused.as_millis());
    }

    #[test]
    fn a_backup_a_little_slower_is_trimmed_for_without_engaging() {
        // 2 % slower: left alone, the lag would pass 1 s in 50 s.
        let run = simulate(120.0, |_| 98e6);
        let (_, worst, _) = run.iter().max_by_key(|(_, lag, _)| *lag).unwrap();
        assert!(*worst < Duration::from_millis(130), "{worst:?}");
        let settled: Vec<_> = run.iter().filter(|(t, _, _)| *t > 30.0).collect();
        for &&(t, lag, share) in &settled {
            // About 2 % / TRIM_GAIN = 10 ms above trim_from (75 ms), give
            // or take the swing of a trim that follows the lag's floor
            // over the window, which trails a rising lag.
            assert!(lag > Duration::from_millis(78) && lag < Duration::from_millis(120), "lag {lag:?} at {t:.1} s");
            assert!(share >= 0.95, "share {share} at {t:.1} s");
        }
        // It costs the primary what the backup lacks, and no more.
        let mean = settled.iter().map(|(_, _, share)| share).sum::<f64>() / settled.len() as f64;
        assert!((0.975..=0.985).contains(&mean), "mean share {mean}");
    }

    #[test]
    fn a_slow_backup_is_followed_without_swinging() {
        // The backup can replay 40 % of the primary's speed for 60 s, then
        // all of it.
        let run = simulate(90.0, |t| if t < 60.0 { 40e6 } else { 100e6 });
        let during = |from: f64, to: f64| run.iter().filter(move |(t, _, _)| *t >= from && *t < to);
        // It engages past the threshold. The lag goes on rising a while
        // after the primary slows (the backup still replays what the
        // primary ran at full speed), then settles well under it.
        let worst = during(0.0, 60.0).map(|&(_, lag, _)| lag).max().unwrap();
        assert!(worst > Duration::from_secs(1) && worst < Duration::from_secs(4), "{worst:?}");
        let settled: Vec<_> = during(20.0, 60.0).collect();
        for &&(t, lag, share) in &settled {
            assert!(lag < Duration::from_millis(300), "lag {lag:?} at {t:.1} s");
            // Around the backup's 40 %: a lag that dips under the target
            // gives back a step (to 0.46) now and then.
            assert!((0.35..=0.5).contains(&share), "share {share} at {t:.1} s");
        }
        // Gradually: no step of more than MAX_STEP.
        for w in run.windows(2) {
            assert!((w[1].2 - w[0].2).abs() <= MAX_STEP + 1e-9, "{:?}", w);
        }
        // Given back once the backup is fast again, and left alone after.
        let after: Vec<_> = during(70.0, 90.0).collect();
        assert!(after.iter().all(|&&(_, lag, share)| share == 1.0 && lag < Duration::from_millis(100)));
    }

    #[test]
    fn short_chunks_and_oversleeping_still_keep_the_share() {
        let mut th = Throttle::new(Duration::from_secs(1));
        th.share = 0.5;
        let busy = Duration::from_micros(300);
        let (mut ran, mut slept, mut sleeps) = (Duration::ZERO, Duration::ZERO, 0);
        for _ in 0..10_000 {
            ran += busy;
            let pause = th.pause_after(busy);
            if !pause.is_zero() {
                // Every sleep comes back 120 µs late.
                let actual = pause + Duration::from_micros(120);
                th.paused(actual);
                slept += actual;
                sleeps += 1;
            }
        }
        let share = ran.as_secs_f64() / (ran + slept).as_secs_f64();
        assert!((share - 0.5).abs() < 0.01, "share {share}");
        // Pauses are gathered, not one per chunk.
        assert!(sleeps < 10_000 / 5, "{sleeps} sleeps");
    }

    #[test]
    fn without_rates_the_share_steps_down_and_back() {
        let t0 = Instant::now();
        let mut th = Throttle::new(Duration::from_secs(1));
        let mut now = t0;
        // The backup never moves and the primary is never seen to run: no
        // rates, so the loop falls back to VMware's plain steps.
        for _ in 0..20 {
            now += STEP_EVERY;
            th.update(Duration::from_secs(3), 0, now);
        }
        assert!(th.share() < 0.4 && th.share() >= MIN_SHARE, "{}", th.share());
        assert!(th.pause_after(Duration::from_millis(10)) > Duration::from_millis(10));
        for _ in 0..100 {
            now += STEP_EVERY;
            th.update(Duration::from_millis(10), 0, now);
        }
        assert_eq!(th.share(), 1.0);
        assert!(!th.engaged());
        assert_eq!(th.pause_after(Duration::from_millis(10)), Duration::ZERO);
    }
}
