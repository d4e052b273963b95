//! The fault-tolerance core tested in-process, without root, network
//! namespaces or a guest image: a primary and a backup of each mode
//! (lockstep, epoch, checkpoint) on one host, over a loopback logging
//! channel and a shared-directory arbiter in a temporary directory, on a
//! small bare-metal guest that talks to a client over virtio-net
//! (`ft_inprocess/guest.c`).
//!
//! Each test cuts the primary at an instruction count chosen by what it
//! is doing there (before it makes an output, while the output is held,
//! right after it left), or partitions the pair, or hands the VM over,
//! and checks what fault tolerance promises (`pair::check_failover`):
//! the backup goes live at a point the primary passed, in the state the
//! primary had there; exactly one side goes live (the arbiter's record,
//! the events, a late claim of the old primary refused); and the Output
//! Rule held, seen from outside: the backup finishes the guest's
//! conversation with the client, and the client never saw two different
//! frames for one round (a frame released before the backup had the
//! input it depends on would be answered by the backup with another).
//!
//! The same for a running VM given a backup (`protect`: the transfer,
//! then the pair), and a planned handover. What these do not cover (TAPs,
//! disks, isolation probes, the live loop's own pacing and control
//! socket, two hosts' clocks) is left to the harness (`harness/tests`).

#[path = "ft_inprocess/pair.rs"]
mod pair;

use ftvm_protection::pair::Mode;
use pair::{check_failover, went_live, PrimaryHost, Site};

/// Where the cut falls, relative to the echo of round `ROUND`: the frame
/// the guest sends right after it was given the client's reply.
#[derive(Clone, Copy)]
enum Cut {
    /// The guest was given the reply (the input is in the log, on its way
    /// to the backup) and has not yet made the echo.
    Before,
    /// The echo is made and held by the pair, not yet released.
    Inside,
    /// The echo has just left the host.
    After,
}

/// The round around whose echo the primary is cut.
const ROUND: u64 = 4;
/// Frames made up to and with that echo (two a round).
const ECHO: usize = 2 * ROUND as usize;

fn cut_here(host: &PrimaryHost, cut: Cut) -> bool {
    match cut {
        Cut::Before => host.made.len() == ECHO - 1 && host.delivered == ROUND,
        Cut::Inside => host.made.len() >= ECHO && host.released.len() < host.made.len(),
        // At least: in checkpoint and epoch mode frames leave in batches.
        Cut::After => host.released.len() >= ECHO,
    }
}

/// A pair of `mode` from the first instruction; the primary dies at
/// `cut`; the backup goes live and finishes the guest's conversation.
fn failover(mode: Mode, cut: Cut, name: &str) {
    let site = Site::new(name);
    let backup = site.start_backup();
    let mut host = PrimaryHost::boot(&site, mode);
    assert!(host.run_until(|h| cut_here(h, cut)), "the guest ended before the cut");
    let at = host.crash(&site);
    let live = went_live(backup);
    let went = check_failover(&site, host, live, at, mode);
    eprintln!("{name}: cut at instruction {at}, the backup went live at {went}");
}

macro_rules! failovers {
    ($($name:ident: $mode:expr, $cut:expr;)*) => {$(
        #[test]
        fn $name() {
            failover($mode, $cut, stringify!($name));
        }
    )*};
}

failovers! {
    lockstep_cut_before_an_output: Mode::Lockstep, Cut::Before;
    lockstep_cut_inside_an_output: Mode::Lockstep, Cut::Inside;
    lockstep_cut_after_an_output: Mode::Lockstep, Cut::After;
    epoch_cut_before_an_output: Mode::Epoch, Cut::Before;
    epoch_cut_inside_an_output: Mode::Epoch, Cut::Inside;
    epoch_cut_after_an_output: Mode::Epoch, Cut::After;
    checkpoint_cut_before_an_output: Mode::Checkpoint, Cut::Before;
    checkpoint_cut_inside_an_output: Mode::Checkpoint, Cut::Inside;
    checkpoint_cut_after_an_output: Mode::Checkpoint, Cut::After;
}

/// A partition: the link is cut while both sides run, so both declare
/// the other failed and contend. Exactly one wins; the other halts
/// without releasing what it held; the winner finishes the conversation.
/// `at_once`: the primary contends as soon as it hears of the cut (a race
/// it won 2 times in 5 here); otherwise its loop takes the news between
/// two runs, by when the backup has claimed (every time here). Either
/// outcome passes if it holds together.
fn partition(at_once: bool, name: &str) {
    let site = Site::new(name);
    let backup = site.start_backup();
    let mut host = PrimaryHost::boot(&site, Mode::Lockstep);
    assert!(host.run_until(|h| cut_here(h, Cut::Inside)));
    site.link.cut();
    if at_once {
        host.contend_at_once();
    } else {
        host.run_until(|h| h.lost_backup.is_some());
    }
    let primary_won = matches!(host.lost_backup, Some(Ok(())));
    let backup_outcome = pair::join(backup);
    let winner = site.arbiter(host.generation).winner().expect("a winner");
    let won: Vec<_> =
        ["primary", "backup"].into_iter().filter(|side| site.events(side).iter().any(|e| e == "arbiter_won")).collect();
    assert_eq!(won.len(), 1, "sides that won the arbiter: {won:?}");
    if primary_won {
        assert!(winner.starts_with("primary on"));
        assert!(backup_outcome.is_err(), "the backup went on although the primary won");
        // Alone now: the primary finishes the conversation itself.
        assert!(!host.run_until(|_| false));
        host.client.check_conversation(pair::LAST_SEQ, &[]);
    } else {
        assert!(winner.starts_with("backup on"));
        assert!(host.primary.is_none(), "the deposed primary still runs protected");
        let live = match backup_outcome {
            Ok(ftvm_vmm::ft::backup::Outcome::Live(live)) => *live,
            _ => panic!("the backup won but did not go live"),
        };
        let at = host.m.icount();
        check_failover(&site, host, live, at, Mode::Lockstep);
    }
    eprintln!("{name}: the {} won", if primary_won { "primary" } else { "backup" });
}

#[test]
fn lockstep_partition_the_primary_contending_between_runs() {
    partition(false, "partition_between_runs");
}

#[test]
fn lockstep_partition_the_primary_contending_at_once() {
    partition(true, "partition_at_once");
}

/// A planned handover: the backup goes live exactly where the primary
/// stopped, in its state, and the primary releases nothing after.
fn handover(mode: Mode, name: &str) {
    let site = Site::new(name);
    let backup = site.start_backup();
    let mut host = PrimaryHost::boot(&site, mode);
    assert!(host.run_until(|h| h.released.len() as u64 >= ROUND));
    host.hand_over();
    let at = host.m.icount();
    let live = went_live(backup);
    assert_eq!(live.machine.icount(), at, "the backup went live elsewhere than where the primary stopped");
    assert!(site.events("primary").iter().any(|e| e == "handed_over"));
    check_failover(&site, host, live, at, mode);
}

#[test]
fn lockstep_handover() {
    handover(Mode::Lockstep, "lockstep_handover");
}

#[test]
fn epoch_handover() {
    handover(Mode::Epoch, "epoch_handover");
}

#[test]
fn checkpoint_handover() {
    handover(Mode::Checkpoint, "checkpoint_handover");
}

/// A VM that ran alone is given a backup (`protect`: its machine goes
/// across while it runs, then the pair starts), and its primary dies
/// right after an output of the protected run.
fn protect_then_crash(mode: Mode, name: &str) {
    let site = Site::new(name);
    let mut host = PrimaryHost::alone();
    assert!(host.run_until(|h| h.released.len() >= 2), "the guest ended before it was protected");
    let backup = site.start_backup();
    host.protect(&site, mode);
    assert!(host.run_until(|h| h.generation > 0), "the guest ended before the transfer");
    let protected_from = host.released.len() as u64;
    assert!(host.run_until(|h| h.released.len() as u64 >= protected_from + 2), "the guest ended protected");
    let at = host.crash(&site);
    let live = went_live(backup);
    check_failover(&site, host, live, at, mode);
}

#[test]
fn lockstep_protect_a_running_vm() {
    protect_then_crash(Mode::Lockstep, "lockstep_protect");
}

#[test]
fn epoch_protect_a_running_vm() {
    protect_then_crash(Mode::Epoch, "epoch_protect");
}

#[test]
fn checkpoint_protect_a_running_vm() {
    protect_then_crash(Mode::Checkpoint, "checkpoint_protect");
}
