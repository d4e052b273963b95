//! SIGTERM and SIGINT as news for the live loop: a host being shut down
//! (by systemd, by an operator emptying it) asks its VMs to go, and a
//! protected VM answers by handing over to its backup instead of dying
//! under it; a VM alone asks its guest to power off (see `live`'s
//! `Stopping`). The `signal-hook` crate because a handler may do almost
//! nothing itself: it wakes a thread, which sends the loop the event.

use crate::host_io::HostEvent;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::sync::mpsc::Sender;

/// From now on SIGTERM and SIGINT reach the loop as
/// [`HostEvent::Terminate`] with the signal's number. Once the loop has
/// gone (its events closed), a signal ends the process as it would have
/// without us. Called before the control socket is made: a signal
/// between the two would end the process with the socket file left.
pub fn forward_stop_signals(events: Sender<HostEvent>) {
    if let Err(e) = spawn(events) {
        eprintln!("ftvm: SIGTERM and SIGINT will not hand over or stop the guest cleanly: {e}");
    }
}

fn spawn(events: Sender<HostEvent>) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new().name("ftvm-signals".into()).spawn(move || {
        for signal in signals.forever() {
            if events.send(HostEvent::Terminate(signal)).is_err() {
                let _ = signal_hook::low_level::emulate_default_handler(signal);
            }
        }
    })?;
    Ok(())
}

/// The signal's name, for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}
